/* The inline stack rule marks a new frame's bytes undefined 16 at a time through a
 * borrowed xmm7 (saved and restored in the thread context, legacy SSE so the bits above
 * 128 stay): the program's ymm7 must come out of calls, rets and large `sub rsp` exactly
 * as it went in. All in one asm block, so no compiler-made code touches ymm7 between. */
#include <stdio.h>
#include <string.h>

int main(void) {
    unsigned char in[32], out[32];
    for (int i = 0; i < 32; i++) in[i] = (unsigned char)(0x11 * (i % 15) + i);
    if (!__builtin_cpu_supports("avx")) {
        puts("kept (no AVX)");
        return 0;
    }
    __asm__ volatile(
        "vmovdqu (%[in]), %%ymm7\n\t"
        "sub $512, %%rsp\n\t"          /* a large new frame */
        "add $512, %%rsp\n\t"
        "sub $128, %%rsp\n\t"          /* keep clear of main's red zone */
        "call 1f\n\t"                  /* call and ret: the red zone below each */
        "jmp 2f\n"
        "1:\n\t"
        "sub $320, %%rsp\n\t"
        "movq $7, (%%rsp)\n\t"
        "add $320, %%rsp\n\t"
        "ret\n"
        "2:\n\t"
        "add $128, %%rsp\n\t"
        "vmovdqu %%ymm7, (%[out])\n\t"
        "vzeroupper\n\t"
        :
        : [in] "r"(in), [out] "r"(out)
        : "xmm7", "memory");
    puts(memcmp(in, out, 32) ? "CLOBBERED" : "kept");
    return 0;
}
