/* Calls and returns whose new stack straddles two 64 KiB spans of Memcheck's shadow: the
   stack is moved so that the call depth of `run` sits at each 16-byte position over a
   span boundary (as ASLR puts a hot call depth anywhere), and a call's red zone (the 136
   bytes below the caller's rsp it makes undefined with the return address) or a ret's
   crosses the boundary at some of them (the engine's stack-split routine,
   crates/oxgrind-engine/src/translate/definedness.rs).
   usage: mc_stack_spans errors   a leaf reads the low and the high end of its red zone
                                  uninitialised at each position: 2 errors per position
          mc_stack_spans hot N    N calls at each position, no error */
#include <alloca.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POSITIONS 26

/* Leaves defined bytes where the leaf's red zone will be. */
__attribute__((noinline)) long fill(void) {
    volatile long a[20];
    for (int i = 0; i < 20; i++)
        a[i] = i;
    return a[3];
}

volatile int hits;

/* Reads both ends of its red zone before writing them, each in a branch. */
__attribute__((noinline)) int leaf(int x) {
    volatile char buf[112];
    if (buf[0])
        hits++;
    if (buf[111])
        hits += 2;
    return x;
}

__attribute__((noinline)) int f(int x) {
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}

__attribute__((noinline)) long run(int errors, long calls) {
    long s = 0;
    if (errors) {
        s += fill();
        s += leaf(1);
        return s;
    }
    for (long i = 0; i < calls; i++)
        s += f((int)i);
    return s;
}

/* `run` called `distance` bytes above a 64 KiB boundary of the stack (less its frame). */
__attribute__((noinline)) long at(long distance, int errors, long calls) {
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
    uintptr_t target = ((sp - 8192) & ~(uintptr_t)0xffff) + distance;
    volatile char *p = alloca(sp - target);
    p[0] = 0;
    return run(errors, calls);
}

int main(int argc, char **argv) {
    int errors = argc > 1 && strcmp(argv[1], "errors") == 0;
    long calls = argc > 2 ? atol(argv[2]) : 1;
    long s = 0;
    for (long i = 0; i < POSITIONS; i++)
        s += at(16 * i, errors, calls) & 1;
    printf("%ld\n", s);
    return 0;
}
