/* compute: CPU-bound, almost no allocation.
 *
 * Why: this shows a tool's fixed cost and, for instrumenting tools (Memcheck, Cachegrind,
 * Valgrind's none), the cost of translating every instruction, with the allocator out of
 * the picture. Two 1 MiB arrays are allocated once; a 3-point stencil then sweeps them.
 *
 * Usage: compute SWEEPS
 */
#include <stdio.h>
#include <stdlib.h>

#define N (1 << 17) /* 128 Ki doubles = 1 MiB per array */

int main(int argc, char **argv) {
    long sweeps = argc > 1 ? atol(argv[1]) : 200;
    double *a = malloc(N * sizeof(double));
    double *b = malloc(N * sizeof(double));
    if (!a || !b) return 1;
    for (long i = 0; i < N; i++) a[i] = (double)(i % 1000) / 1000.0;
    for (long s = 0; s < sweeps; s++) {
        b[0] = a[0];
        b[N - 1] = a[N - 1];
        for (long i = 1; i < N - 1; i++) b[i] = 0.25 * a[i - 1] + 0.5 * a[i] + 0.25 * a[i + 1];
        double *t = a; a = b; b = t;
    }
    double sum = 0;
    for (long i = 0; i < N; i++) sum += a[i];
    printf("compute sweeps=%ld checksum=%.6f\n", sweeps, sum);
    free(a);
    free(b);
    return 0;
}
