/* Correct programs that move the stack pointer in unusual ways: a signal handler on an
   alternate stack and on the main stack, makecontext/swapcontext coroutines on a heap
   stack, alloca, vfork, threads with deep and shallow calls. Memcheck must report nothing
   here, as Valgrind reports nothing. */
#include <alloca.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

static volatile sig_atomic_t hits;

static void on_usr1(int sig, siginfo_t *info, void *uc) {
    char buf[512];
    memset(buf, sig, sizeof buf);
    hits += buf[100] + (info->si_signo == sig) + (uc != NULL);
}

static ucontext_t main_ctx, co_ctx;
static int co_steps;

static void coroutine(void) {
    for (int i = 0; i < 3; i++) {
        char local[300];
        memset(local, i, sizeof local);
        co_steps += local[299] + 1;
        swapcontext(&co_ctx, &main_ctx);
    }
}

static int deep(int n) {
    char frame[200];
    memset(frame, n, sizeof frame);
    return n == 0 ? frame[5] : deep(n - 1) + frame[199];
}

static void *worker(void *arg) {
    long n = (long)arg;
    int s = deep(50);
    char *a = alloca(1000 + n);
    memset(a, 1, 1000 + n);
    return (void *)(long)(s + a[999]);
}

int main(void) {
    /* A handler on an alternate stack, then on the main stack. */
    stack_t ss = {.ss_sp = malloc(SIGSTKSZ * 4), .ss_size = SIGSTKSZ * 4};
    sigaltstack(&ss, NULL);
    struct sigaction sa = {.sa_sigaction = on_usr1, .sa_flags = SA_SIGINFO | SA_ONSTACK};
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGUSR1, &sa, NULL);
    raise(SIGUSR1);

    /* Coroutines on a heap stack. */
    size_t co_size = 64 * 1024;
    getcontext(&co_ctx);
    co_ctx.uc_stack.ss_sp = malloc(co_size);
    co_ctx.uc_stack.ss_size = co_size;
    co_ctx.uc_link = &main_ctx;
    makecontext(&co_ctx, coroutine, 0);
    for (int i = 0; i < 3; i++)
        swapcontext(&main_ctx, &co_ctx);

    /* alloca and deep recursion. */
    char *a = alloca(20000);
    memset(a, 2, 20000);
    int d = deep(100);

    /* vfork. */
    pid_t pid = vfork();
    if (pid == 0)
        _exit(deep(3) == 0 ? 0 : 7);
    int status = 0;
    waitpid(pid, &status, 0);

    /* Threads. */
    pthread_t t[4];
    long sum = 0;
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        sum += (long)r;
    }

    printf("%d %d %d %d %ld %d\n", hits > 0, co_steps, a[19999], d, sum, WEXITSTATUS(status));
    free(co_ctx.uc_stack.ss_sp);
    free(ss.ss_sp);
    return 0;
}
