# Fault injection, python3 (see faults.c): the same modes, from the interpreter.
import ctypes, os, resource, signal, subprocess, sys, threading, time

libc = ctypes.CDLL(None)
keep = [bytearray(16384) for _ in range(64)]
stop = False

def churn():
    while not stop:
        x = [bytes(100) for _ in range(10)]
        time.sleep(0.002)

threading.Thread(target=churn, daemon=True).start()
how = sys.argv[1] if len(sys.argv) > 1 else "exit"
print("mode", how, flush=True)

def limit(res, nbytes):
    resource.setrlimit(res, (nbytes, nbytes))
    v = [bytes(1000 + i) for i in range(4000)]
    try:
        big = bytearray(nbytes * 2)
        r = "ok"
    except MemoryError:
        r = "null"
    print(f"small={len(v)} big={r}", flush=True)
    os._exit(0)

if how == "exit": sys.exit(3)
elif how == "sigint": signal.signal(signal.SIGINT, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGINT); time.sleep(10)
elif how == "sigterm": os.kill(os.getpid(), signal.SIGTERM); time.sleep(10)
elif how == "segv": ctypes.string_at(16)
elif how == "abort": os.abort()
elif how == "_exit": os._exit(4)
elif how == "thread-exit":
    threading.Thread(target=lambda: libc.exit(7)).start(); time.sleep(10)
elif how == "exec": os.execv("/bin/sh", ["sh", "-c", "echo exec-ed; exit 9"])
elif how == "fork":
    pid = os.fork()
    if pid == 0:
        keep.append(bytearray(5000)); os._exit(5)
    _, status = os.waitpid(pid, 0); print("child status", os.waitstatus_to_exitcode(status), flush=True); sys.exit(6)
elif how == "vfork":
    r = subprocess.run(["/bin/true"]); print("child status", r.returncode, flush=True); sys.exit(6)
elif how == "rlimit-as": limit(resource.RLIMIT_AS, 256 << 20)
elif how == "rlimit-data": limit(resource.RLIMIT_DATA, 64 << 20)
elif how == "rlimit-nofile":
    resource.setrlimit(resource.RLIMIT_NOFILE, (16, 16)); n = 0
    try:
        while True: os.open("/dev/null", os.O_RDONLY); n += 1
    except OSError: pass
    print(f"opened {n} more", flush=True); os._exit(0)
elif how == "close-std": os.close(0); os.close(1); os.close(2); keep.append(bytearray(10)); os._exit(8)
else: print("unknown mode", how, file=sys.stderr); sys.exit(2)
