/* A signal the program keeps blocked except while it waits: pselect, ppoll, epoll_pwait
 * and sigsuspend each unblock it for the duration of the call only (a temporary mask), so
 * the kernel delivers it as the call ends with EINTR, and the handler runs with the
 * temporary mask in force; when the handler returns, the program's usual mask (the
 * signal blocked again) comes back. gpg-agent waits so (npth's pselect with an empty mask).
 *
 * Under the engine the signal arrived right after the `syscall` instruction, in engine
 * code: it was deferred, the usual mask came back, and re-raising it only left it pending
 * and blocked. The handler never ran, and the next wait, unblocking it again, failed with
 * EINTR at once: a busy loop for ever (gpg-agent at 50% CPU).
 *
 * Prints, per way of waiting: the number of EINTRs before the handler had run (1
 * natively), whether the handler ran with the temporary mask (another signal the program
 * blocks, SIGUSR2, unblocked inside the handler) and was given the usual mask to restore
 * (SIGALRM and SIGUSR2 in uc_sigmask), and whether the usual mask is back after the call.
 * Then real-time signals queued while blocked and unblocked by one sigprocmask: the
 * kernel delivers every instance as that call returns (in engine code too, where they were
 * deferred and merged: one of five was lost). Then a last wait with nothing to come: the
 * thread must idle (CPU time far below the wait's length). Exit status 0 when everything
 * is as natively. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/time.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

static volatile sig_atomic_t handled;
static volatile sig_atomic_t usr2_open_in_handler;
static volatile sig_atomic_t usual_mask_in_frame;

static void on_alarm(int sig, siginfo_t *si, void *ucv) {
  ucontext_t *uc = ucv;
  sigset_t now;
  sigprocmask(SIG_BLOCK, NULL, &now);
  usr2_open_in_handler = !sigismember(&now, SIGUSR2);
  usual_mask_in_frame =
      sigismember(&uc->uc_sigmask, SIGALRM) && sigismember(&uc->uc_sigmask, SIGUSR2);
  handled++;
  (void)sig;
  (void)si;
}

static void arm(void) {
  struct itimerval it = {{0, 0}, {0, 20000}};
  setitimer(ITIMER_REAL, &it, NULL);
}

static int epfd;

/* One wait with the empty mask; -1 with errno as the call left it. */
static int wait_once(const char *how, const sigset_t *open) {
  struct timespec ts = {5, 0};
  if (!strcmp(how, "pselect")) return pselect(0, NULL, NULL, NULL, &ts, open);
  if (!strcmp(how, "ppoll")) return ppoll(NULL, 0, &ts, open);
  if (!strcmp(how, "epoll_pwait")) {
    struct epoll_event ev;
    return epoll_pwait(epfd, &ev, 1, 5000, open);
  }
  return sigsuspend(open);
}

static volatile int queued[16], nqueued;

static void on_queued(int sig, siginfo_t *si, void *ucv) {
  if (nqueued < 16) queued[nqueued++] = si->si_value.sival_int;
  (void)sig;
  (void)ucv;
}

/* Five real-time signals, two numbers, queued while blocked, then unblocked at once. */
static int queued_all_delivered(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_queued;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGRTMIN, &sa, NULL);
  sigaction(SIGRTMIN + 1, &sa, NULL);
  sigset_t rt;
  sigemptyset(&rt);
  sigaddset(&rt, SIGRTMIN);
  sigaddset(&rt, SIGRTMIN + 1);
  sigprocmask(SIG_BLOCK, &rt, NULL);
  for (int i = 1; i <= 5; i++)
    sigqueue(getpid(), SIGRTMIN + (i % 2 == 0), (union sigval){.sival_int = i});
  sigprocmask(SIG_UNBLOCK, &rt, NULL);
  printf("queued real-time signals: delivered=%d order=", nqueued);
  for (int i = 0; i < nqueued; i++) printf("%d", queued[i]);
  printf("\n");
  return nqueued == 5;
}

static double thread_cpu_seconds(void) {
  struct rusage ru;
  getrusage(RUSAGE_THREAD, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
         (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int main(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_alarm;
  sa.sa_flags = SA_SIGINFO;
  sigaction(SIGALRM, &sa, NULL);
  sigset_t usual, open;
  sigemptyset(&usual);
  sigaddset(&usual, SIGALRM);
  sigaddset(&usual, SIGUSR2);
  sigprocmask(SIG_SETMASK, &usual, NULL);
  sigemptyset(&open);
  epfd = epoll_create1(0);
  int ok = 1;
  const char *ways[] = {"pselect", "ppoll", "epoll_pwait", "sigsuspend"};
  for (int w = 0; w < 4; w++) {
    handled = usr2_open_in_handler = usual_mask_in_frame = 0;
    arm();
    int eintr = 0, other = 0;
    /* Natively: one EINTR, the handler has run. Under the bug: EINTR after EINTR, the
       handler never. Give up after 1000 rather than spin for ever. */
    while (!handled && eintr < 1000) {
      int r = wait_once(ways[w], &open);
      if (r < 0 && errno == EINTR)
        eintr++;
      else
        other++;
      if (other) break;
    }
    sigset_t after;
    sigprocmask(SIG_BLOCK, NULL, &after);
    int usual_back = sigismember(&after, SIGALRM) && sigismember(&after, SIGUSR2);
    printf("%s: eintr=%d other=%d handled=%d usr2_open_in_handler=%d usual_mask_in_frame=%d "
           "usual_mask_back=%d\n",
           ways[w], eintr, other, (int)handled, (int)usr2_open_in_handler,
           (int)usual_mask_in_frame, usual_back);
    ok &= eintr == 1 && !other && handled == 1 && usr2_open_in_handler && usual_mask_in_frame &&
          usual_back;
  }
  ok &= queued_all_delivered();
  /* Nothing more is coming: a 300 ms wait must leave the thread idle. */
  double before = thread_cpu_seconds();
  struct timespec ts = {0, 300000000};
  int r = pselect(0, NULL, NULL, NULL, &ts, &open);
  double used = thread_cpu_seconds() - before;
  int idle = r == 0 && used < 0.1;
  printf("idle wait: timed_out=%d idle=%d\n", r == 0, idle);
  if (!idle) fprintf(stderr, "idle wait: result %d, %.3f s of CPU in 0.3 s\n", r, used);
  return ok && idle ? 0 : 1;
}
