// --time-unit=i: as time_i_calls.c, for C++'s operator new and delete, plain and array
// (the nothrow forms count a few instructions less than Valgrind's wrapper for them: not
// compared): N calls of each in a tight loop, one snapshot per call, so the per-call
// instruction count (loop + wrapper) can be compared with Valgrind's.
#define N 10

static void *volatile p[N];

int main() {
    for (int i = 0; i < N; i++) p[i] = new char[100];
    for (int i = 0; i < N; i++) delete[] static_cast<char *>(p[i]);
    for (int i = 0; i < N; i++) p[i] = new long;
    for (int i = 0; i < N; i++) delete static_cast<long *>(p[i]);
    return 0;
}
