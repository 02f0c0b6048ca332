/* Accesses to a frame whose function has returned, through a pointer that outlived it
   (not through rsp): the classic "address of a local returned", a pointer kept in a global
   and one kept in a struct, on the main thread and on another thread. Memcheck reports each
   ("is on thread N's stack", "N bytes below stack pointer"); a pointer into a live frame is
   fine, and so is one into the dead frame's part still inside the red zone. */
#include <pthread.h>
#include <stdio.h>

struct holder {
    int *slot;
};

static int *volatile kept;
static struct holder holder;

/* Each frame is written whole (nonzero), as a thread's stack shows how deep it has been. */
__attribute__((noinline)) static int *address_of_local(int v) {
    volatile int big[64];
    for (int i = 0; i < 64; i++)
        big[i] = v + 1;
    int *volatile p = (int *)&big[1];
    return p;
}

__attribute__((noinline)) static void keep_in_global(int v) {
    volatile char pad[300];
    for (int i = 0; i < 300; i++)
        pad[i] = (char)(v + 1);
    kept = (int *)&pad[16];
}

__attribute__((noinline)) static void keep_in_struct(struct holder *h, int v) {
    volatile int local[50];
    for (int i = 0; i < 50; i++)
        local[i] = v + 1;
    h->slot = (int *)&local[2];
    __asm__ volatile("" ::: "memory");
}

__attribute__((noinline)) static int *in_red_zone(void) {
    volatile int near = 4;
    int *volatile p = (int *)&near;
    return p;
}

__attribute__((noinline)) static int live_frame(int *p) {
    return *p; /* the caller's local, still live: no error */
}

__attribute__((noinline)) static int run_all(int rounds) {
    int sum = 0, mine = 3;
    for (int i = 0; i < rounds; i++) {
        int *p = address_of_local(i);
        sum += *p;             /* read of size 4, a dead frame */
        keep_in_global(i);
        *kept = 5;             /* write of size 4 */
        keep_in_struct(&holder, i);
        sum += holder.slot[0]; /* read through a struct's pointer */
        sum += live_frame(&mine);
        sum += *in_red_zone(); /* dead, but within the red zone: no error */
    }
    return sum;
}

static void *thread_main(void *arg) {
    return (void *)(long)run_all((int)(long)arg);
}

int main(void) {
    int sum = run_all(3);
    pthread_t t;
    pthread_create(&t, NULL, thread_main, (void *)2L);
    void *r;
    pthread_join(t, &r);
    printf("%d\n", (sum + (int)(long)r) & 0);
    return 0;
}
