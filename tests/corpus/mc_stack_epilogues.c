/* Moves of rsp from another register (the engine's fast forms with a run-time move,
   FastForm::rsp_from): epilogues that set rsp from rbp going up (leave, mov rsp, rbp,
   lea rsp, [rbp-8]) mark nothing; the same forms moving rsp down make new stack, which
   is undefined (Memcheck's stack rule): each function below reads a slot of it and
   returns it, and main branches on it (one error per function). Before each, `fill`
   leaves defined bytes where that slot will be: only the stack rule makes it undefined. */
#include <stdio.h>

int down_via_lea(void);
int down_via_mov(void);
long frame_epilogues(long x);

__asm__(".text\n"
        ".globl down_via_lea\n.type down_via_lea,@function\n"
        "down_via_lea:\n"
        "  push %rbp\n  mov %rsp, %rbp\n"
        "  lea -0x200(%rbp), %rsp\n" /* down 0x200: [rbp-0x280, rbp-0x80) undefined */
        "  mov 0x100(%rsp), %eax\n"
        "  leave\n  ret\n"
        ".globl down_via_mov\n.type down_via_mov,@function\n"
        "down_via_mov:\n"
        "  push %rbp\n  mov %rsp, %rbp\n"
        "  lea -0x300(%rbp), %rdx\n  mov %rdx, %rsp\n"
        "  mov 0x180(%rsp), %eax\n"
        "  mov %rbp, %rsp\n  pop %rbp\n  ret\n"
        /* Up moves only, every slot read written first: no error. */
        ".globl frame_epilogues\n.type frame_epilogues,@function\n"
        "frame_epilogues:\n"
        "  push %rbp\n  mov %rsp, %rbp\n  push %rbx\n  sub $0x38, %rsp\n"
        "  mov %rdi, 0x10(%rsp)\n  mov 0x10(%rsp), %rax\n  add $1, %rax\n"
        "  lea -8(%rbp), %rsp\n  pop %rbx\n  pop %rbp\n"
        "  push %rbp\n  mov %rsp, %rbp\n  sub $0x20, %rsp\n"
        "  mov %rax, -8(%rbp)\n  mov -8(%rbp), %rax\n"
        "  mov %rbp, %rsp\n  pop %rbp\n"
        "  push %rbp\n  mov %rsp, %rbp\n  sub $0x40, %rsp\n"
        "  mov %rax, -0x10(%rbp)\n  add -0x10(%rbp), %rax\n"
        "  leave\n  ret\n");

/* Writes the stack below its caller's frame, defined. */
__attribute__((noinline)) long fill(void) {
    volatile char buf[2048];
    for (int i = 0; i < 2048; i++)
        buf[i] = (char)i;
    return buf[7];
}

int main(void) {
    long s = 0;
    for (long i = 0; i < 1000; i++)
        s += frame_epilogues(i);
    if (s != 1001000)
        printf("wrong sum %ld\n", s);
    s += fill() - 7;
    if (down_via_lea() == 7)
        puts("seven");
    s += fill() - 7;
    if (down_via_mov() == 7)
        puts("seven");
    printf("%ld\n", s);
    return 0;
}
