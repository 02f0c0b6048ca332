/* C entry points of the runtime that Rust cannot express.
 *
 * - C++ operator new must throw std::bad_alloc when memory runs out, and an exception must
 *   not unwind through Rust frames (the runtime is built with panic=abort). So each operator
 *   asks Rust for the block and, on failure, throws from this C frame, compiled with
 *   -fexceptions so the unwinder can pass through it.
 * - execl, execlp and execle are variadic: they gather their arguments and call the Rust
 *   execve/execvp interposers, so the report is written before the image is replaced.
 * - The runtime's per-thread block must be reachable without a call into the dynamic
 *   loader (see oxg_thread_block_addr); stable Rust cannot choose a TLS model.
 */
#include <stddef.h>
#include <stdarg.h>
#include <stdint.h>

/* Implemented in Rust (hooks.rs: oxgrind_new, reached through the translation engine's native
 * entry so that none of it runs translated). which: the entry point, 0-7 as NEW_NAMES there
 * (odd: new[]). */
extern void *oxgrind_new_entry(size_t size, size_t align, int which, uint64_t sp, uint64_t bp)
    __attribute__((visibility("hidden")));
/* libstdc++'s thrower; weak so C programs, which never call operator new, load fine. */
extern void _ZSt17__throw_bad_allocv(void) __attribute__((weak, noreturn));
extern void abort(void) __attribute__((noreturn));
extern int execve(const char *path, char *const argv[], char *const envp[]);
extern int execvp(const char *file, char *const argv[]);
extern char **environ;

typedef struct { int dummy; } nothrow_t;

/* The storage of the runtime's per-thread state (guard.rs, ThreadState, whose all-zero
 * bytes are its initial value). Initial-exec: the runtime is loaded with the program, so the
 * block is in the static TLS every thread is created with, at a fixed offset from %fs.
 * A Rust thread_local! in a shared library is general-dynamic instead: each lookup calls
 * the loader's __tls_get_addr, which runs translated and reads the thread's DTV, a heap
 * block the loader malloc'd. Those reads happen before the runtime can tell the engine
 * that its own work starts, so a heap tool (DHAT) charged them to the program. */
static __thread unsigned char oxg_thread_block[64]
    __attribute__((tls_model("initial-exec"), aligned(16)));

__attribute__((visibility("hidden"))) void *oxg_thread_block_addr(void) {
    return oxg_thread_block;
}

/* The unwinder's per-thread state (oxgrind_symbols::set_thread_slots), initial-exec for the
 * same reason: it is looked at on every stack capture. */
static __thread unsigned char oxg_unwind_block[32]
    __attribute__((tls_model("initial-exec"), aligned(16)));

__attribute__((visibility("hidden"))) void *oxg_unwind_block_addr(void) {
    return oxg_unwind_block;
}

/* The runtime's per-thread cache of recent allocation stacks (stacks.rs, WalkCache) is
 * looked at on every capture: its address is kept here, initial-exec for the same reason
 * (null when the thread starts; glibc clears it again for a thread that reuses a cached
 * stack). The cache itself lives in the runtime's heap, not here: static TLS is carved
 * from every thread's stack, and a program that asks for a small one (PTHREAD_STACK_MIN,
 * 16 KiB) had too little left for its own frames (or none: pthread_create's EINVAL). */
static __thread void *oxg_walk_cache_ptr __attribute__((tls_model("initial-exec")));

__attribute__((visibility("hidden"))) void **oxg_walk_cache_slot(void) {
    return &oxg_walk_cache_ptr;
}

/* The top of this thread's hook stack (hookstack.rs) while the heap path may switch to it,
 * 0 when the thread has none or is on it already. Read on every heap-path event by the
 * switch (hookstack::on_hook_stack!, one %fs-relative load), so initial-exec as above; not
 * static: the switch names it in assembly. */
__attribute__((visibility("hidden"), tls_model("initial-exec"))) __thread unsigned long
    oxg_hook_stack_top;

__attribute__((visibility("hidden"))) unsigned long *oxg_hook_stack_slot(void) {
    return &oxg_hook_stack_top;
}

/* The exported entry points are tiny Rust functions that jump here (exports.rs): a Rust
 * cdylib exports only what Rust defines. `which` names the entry point for frame 0 of the
 * stack, as an index into hooks::NEW_NAMES. */

static void *must(void *p) {
    if (!p) {
        if (_ZSt17__throw_bad_allocv) _ZSt17__throw_bad_allocv();
        abort();
    }
    return p;
}

/* `sp` and `bp`: the program's stack and frame pointers at its call, passed on by the
 * exported entry point (exports.rs) so that the stack walk starts in the caller. */
void *oxgrind_c_Znwm(size_t size, uint64_t sp, uint64_t bp) {
    return must(oxgrind_new_entry(size, 0, 0, sp, bp));
}
void *oxgrind_c_Znam(size_t size, uint64_t sp, uint64_t bp) {
    return must(oxgrind_new_entry(size, 0, 1, sp, bp));
}
void *oxgrind_c_ZnwmRKSt9nothrow_t(size_t size, const nothrow_t *nt, uint64_t sp, uint64_t bp) {
    (void)nt; return oxgrind_new_entry(size, 0, 2, sp, bp);
}
void *oxgrind_c_ZnamRKSt9nothrow_t(size_t size, const nothrow_t *nt, uint64_t sp, uint64_t bp) {
    (void)nt; return oxgrind_new_entry(size, 0, 3, sp, bp);
}
void *oxgrind_c_ZnwmSt11align_val_t(size_t size, size_t align, uint64_t sp, uint64_t bp) {
    return must(oxgrind_new_entry(size, align, 4, sp, bp));
}
void *oxgrind_c_ZnamSt11align_val_t(size_t size, size_t align, uint64_t sp, uint64_t bp) {
    return must(oxgrind_new_entry(size, align, 5, sp, bp));
}
void *oxgrind_c_ZnwmSt11align_val_tRKSt9nothrow_t(size_t size, size_t align, const nothrow_t *nt,
                                                  uint64_t sp, uint64_t bp) {
    (void)nt; return oxgrind_new_entry(size, align, 6, sp, bp);
}
void *oxgrind_c_ZnamSt11align_val_tRKSt9nothrow_t(size_t size, size_t align, const nothrow_t *nt,
                                                  uint64_t sp, uint64_t bp) {
    (void)nt; return oxgrind_new_entry(size, align, 7, sp, bp);
}

#define MAX_EXEC_ARGS 4096

static int gather(const char *arg0, va_list ap, char **argv) {
    int n = 0;
    argv[n++] = (char *)arg0;
    while (argv[n - 1] != NULL) {
        if (n >= MAX_EXEC_ARGS) return -1;
        argv[n++] = va_arg(ap, char *);
    }
    return n;
}

int oxgrind_c_execl(const char *path, const char *arg0, ...) {
    char *argv[MAX_EXEC_ARGS];
    va_list ap;
    va_start(ap, arg0);
    int n = gather(arg0, ap, argv);
    va_end(ap);
    if (n < 0) return -1;
    return execve(path, argv, environ);
}

int oxgrind_c_execlp(const char *file, const char *arg0, ...) {
    char *argv[MAX_EXEC_ARGS];
    va_list ap;
    va_start(ap, arg0);
    int n = gather(arg0, ap, argv);
    va_end(ap);
    if (n < 0) return -1;
    return execvp(file, argv);
}

int oxgrind_c_execle(const char *path, const char *arg0, ...) {
    char *argv[MAX_EXEC_ARGS];
    va_list ap;
    va_start(ap, arg0);
    int n = gather(arg0, ap, argv);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    if (n < 0) return -1;
    return execve(path, argv, envp);
}
