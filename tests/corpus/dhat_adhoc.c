/* DHAT --mode=ad-hoc: events reported with the DHAT_AD_HOC_EVENT client request. */
#include <valgrind/dhat.h>

__attribute__((noinline)) static void event_a(int n) { DHAT_AD_HOC_EVENT(n); }
__attribute__((noinline)) static void event_b(int n) { DHAT_AD_HOC_EVENT(n); }

int main(void) {
    for (int i = 0; i < 5; i++) event_a(10);
    event_a(3);
    event_b(7);
    event_b(7);
    return 0;
}
