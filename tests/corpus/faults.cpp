// Fault injection, C++ (see faults.c): the same modes, with new[], std::thread and
// static objects whose destructors run at exit.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>
#include <sys/resource.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

static std::vector<char *> keep;
static std::atomic<bool> stop{false};
struct Noisy { std::string *s = new std::string(100, 'x'); ~Noisy() { delete s; } } noisy;

static int limit(int resource, rlim_t bytes) {
    struct rlimit r = {bytes, bytes};
    if (setrlimit(resource, &r)) { perror("setrlimit"); return 1; }
    size_t ok = 0;
    std::vector<std::string> v;
    for (int i = 0; i < 4000; i++) { v.emplace_back(1000 + i, 'y'); ok++; }
    char *big = new (std::nothrow) char[bytes * 2];
    std::printf("small=%zu big=%s\n", ok, big ? "ok" : "null");
    return 0;
}

int main(int argc, char **argv) {
    std::string how = argc > 1 ? argv[1] : "exit";
    for (int i = 0; i < 64; i++) keep.push_back(new char[16384]);
    std::thread churn([] { while (!stop) { delete new int[25]; usleep(2000); } });
    churn.detach();
    std::printf("mode %s\n", how.c_str());
    std::fflush(stdout);
    if (how == "exit") return 3;
    if (how == "sigint") std::raise(SIGINT);
    if (how == "sigterm") kill(getpid(), SIGTERM);
    if (how == "segv") { volatile int *p = (int *)16; return *p; }
    if (how == "abort") std::abort();
    if (how == "_exit") _exit(4);
    if (how == "thread-exit") { std::thread([] { std::exit(7); }).detach(); for (;;) pause(); }
    if (how == "exec") { execl("/bin/sh", "sh", "-c", "echo exec-ed; exit 9", (char *)nullptr); return 126; }
    if (how == "fork" || how == "vfork") {
        pid_t pid = how[0] == 'v' ? vfork() : fork();
        if (pid == 0) {
            if (how[0] == 'v') { execl("/bin/true", "true", (char *)nullptr); _exit(127); }
            keep.push_back(new char[5000]);
            return 5;
        }
        int status;
        waitpid(pid, &status, 0);
        std::printf("child status %d\n", WEXITSTATUS(status));
        return 6;
    }
    if (how == "rlimit-as") return limit(RLIMIT_AS, 256 << 20);
    if (how == "rlimit-data") return limit(RLIMIT_DATA, 64 << 20);
    if (how == "rlimit-nofile") {
        struct rlimit r = {16, 16};
        setrlimit(RLIMIT_NOFILE, &r);
        int n = 0;
        while (open("/dev/null", O_RDONLY) >= 0) n++;
        std::printf("opened %d more\n", n);
        return 0;
    }
    if (how == "close-std") { close(0); close(1); close(2); keep.push_back(new char[10]); return 8; }
    std::fprintf(stderr, "unknown mode %s\n", how.c_str());
    return 2;
}
