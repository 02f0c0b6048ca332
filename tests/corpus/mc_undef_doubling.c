/* x + x is x << 1 for definedness, as VEX folds it (Add(t,t) ==> Shl(t,1)): doubling a word
 * whose top bit is undefined leaves a defined sign, so branching on it is no error; with
 * bit 30 undefined it is one. Both forms: `lea (r,r,1)` and `add r,r` (gcc's cc1 doubles
 * bit-field words this way). Valgrind reports 2 errors, one per form, in the cases with
 * bit 30 undefined. */
#include <stdio.h>
#include <stdlib.h>

struct top_undefined { unsigned low : 31; unsigned top : 1; };
struct bit30_undefined { unsigned low : 30; unsigned b30 : 1; unsigned top : 1; };

static int __attribute__((noinline)) sign_after_lea(unsigned w) {
    unsigned d;
    __asm__("lea (%q1,%q1,1), %0" : "=r"(d) : "r"(w));
    return (int)d < 0;
}

static int __attribute__((noinline)) sign_after_add(unsigned w) {
    __asm__("add %0, %0" : "+r"(w));
    return (int)w < 0;
}

int main(void) {
    struct top_undefined *t = malloc(sizeof *t);
    struct bit30_undefined *u = malloc(sizeof *u);
    t->low = 0x40000001; /* bit 30 set, defined; the top bit never written */
    u->low = 5;
    u->top = 0;          /* bit 30 never written */
    unsigned tw, uw;
    __builtin_memcpy(&tw, t, 4);
    __builtin_memcpy(&uw, u, 4);
    if (sign_after_lea(tw)) /* defined: bit 30 */
        puts("lea: negative");
    if (sign_after_add(tw))
        puts("add: negative");
    if (sign_after_lea(uw)) /* undefined: bit 30 */
        puts("lea: negative");
    if (sign_after_add(uw))
        puts("add: negative");
    free(t);
    free(u);
    return 0;
}
