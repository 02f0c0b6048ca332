#!/usr/bin/env python3
"""Runs oxgrind, Valgrind and heaptrack side by side on the same workloads.

Why it exists: people choose a memory tool by how much slower it makes their program and
how much memory it takes. This script measures exactly that, on this machine, in one run:
each workload natively, under each oxgrind tool that works at the moment, under the
matching Valgrind tool and under heaptrack, with runs of the different configurations
interleaved (rotated each round) so that drift in machine load hits them all alike.

For every (workload, configuration) it reports the median wall time and its ratio to the
native run, the median peak RSS and its ratio to native, the median user+system CPU time
and the size of what the tool wrote. Results go to a JSON file and, with --write-docs, to
docs/benchmarks.md. Nothing here is a test: no number is asserted anywhere.

    python3 bench/run.py --quick               # native runs >= 0.3 s, 3 rounds
    python3 bench/run.py --full --write-docs   # the long run, and rewrite the docs page

Standard library only; Linux only (/proc, and bench/spawn.c for the measuring).
"""

import argparse
import datetime
import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
WORKLOAD_SRC = BENCH / "workloads"
BUILD = BENCH / "build"  # compiled workloads, generated inputs, run directories (ignored by git)

# Tools compared one to one, in the order the tables show them. Options are the ones a user
# would pass; oxgrind gets the same options as Valgrind (it accepts Valgrind's syntax).
TOOLS = ["memcheck", "massif", "dhat", "cachegrind", "none"]
TOOL_OPTIONS = {"memcheck": ["--leak-check=full"]}

# Debian's programs, by absolute path, so a pyenv shim or a venv on PATH is never measured.
PYTHON = "/usr/bin/python3"
SQLITE = "/usr/bin/sqlite3"
XZ = "/usr/bin/xz"

CFLAGS = ["-O2", "-g"]  # frame pointers stay omitted, as in Debian's own packages
RUSTFLAGS = ["-C", "opt-level=2", "-g"]

# Environment for every measured run: deterministic Python hashing (so stdout compares
# equal between runs) and a fixed locale.
RUN_ENV_EXTRA = {"PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "LC_ALL": "C"}


class Workload:
    """One program to measure: how to build it, its argument list for a size, its sizes."""

    def __init__(self, name, lang, what, quick, full, unit, argv):
        self.name = name
        self.lang = lang
        self.what = what
        self.sizes = {"quick": quick, "full": full}
        self.unit = unit
        self._argv = argv

    def argv(self, size):
        return [str(a) for a in self._argv(size)]


def sqlite_script(rows):
    return BUILD / f"sqlite-{rows}.sql"


def xz_input(kib):
    return BUILD / f"text-{kib}k.txt"


WORKLOADS = [
    Workload("alloc", "C", "small malloc/calloc/free, 4096 live blocks, 3 call sites",
             11_000_000, 33_000_000, "iterations", lambda n: [BUILD / "alloc", n]),
    Workload("containers", "C++", "std::map, std::unordered_map, std::vector, std::string churn",
             520, 1560, "rounds", lambda n: [BUILD / "containers", n]),
    Workload("threads", "C", "4 threads of malloc/free, bounded live sets, cross-thread frees",
             5_500_000, 16_500_000, "iterations per thread", lambda n: [BUILD / "threads", n]),
    Workload("churn", "Rust", "Vec/String/HashMap churn on 2 threads",
             1_450_000, 4_350_000, "iterations per thread", lambda n: [BUILD / "churn", n]),
    Workload("compute", "C", "CPU-bound 3-point stencil, 2 allocations",
             5000, 15000, "sweeps", lambda n: [BUILD / "compute", n]),
    Workload("python3", "Debian", "python3 script: JSON, dicts, sorting, formatting",
             28, 84, "rounds", lambda n: [PYTHON, WORKLOAD_SRC / "script.py", n]),
    Workload("sqlite3", "Debian", "sqlite3 in memory: insert, index, group, update, delete, join",
             160_000, 480_000, "rows", lambda n: [SQLITE, ":memory:", f".read {sqlite_script(n)}"]),
    Workload("xz", "Debian", "xz -6 -T1 compressing generated text to stdout",
             1100, 3300, "KiB of input", lambda n: [XZ, "-c", "-T1", "-6", xz_input(n)]),
]

# Both modes size every workload for a native run of at least 0.3 s of CPU (full: about 1 s),
# so that no tool's start-up (Valgrind's is ~0.3 s) decides a ratio. A run is killed after
# `timeout` seconds or SLOWEST times its workload's native wall time, whichever comes first.
MODES = {"quick": {"runs": 3, "timeout": 300}, "full": {"runs": 5, "timeout": 1800}}
SLOWEST = 200  # Valgrind Memcheck runs compute at ~102x native CPU on an AMD EPYC host


# ---------------------------------------------------------------------------------------
# building the workloads and their inputs


def newer(target, *sources):
    return target.exists() and all(target.stat().st_mtime >= s.stat().st_mtime for s in sources)


def build_workloads(sizes_wanted):
    """Compiles the project's workloads into bench/build and generates the inputs the
    Debian programs read. Returns the compile commands, for the results page."""
    BUILD.mkdir(exist_ok=True)
    commands = []
    jobs = [
        ("alloc", ["gcc", *CFLAGS, "-o", BUILD / "alloc", WORKLOAD_SRC / "alloc.c"]),
        ("threads", ["gcc", *CFLAGS, "-pthread", "-o", BUILD / "threads", WORKLOAD_SRC / "threads.c"]),
        ("compute", ["gcc", *CFLAGS, "-o", BUILD / "compute", WORKLOAD_SRC / "compute.c"]),
        ("trivial", ["gcc", *CFLAGS, "-o", BUILD / "trivial", WORKLOAD_SRC / "trivial.c"]),
        ("spawn", ["gcc", "-O2", "-o", BUILD / "spawn", BENCH / "spawn.c"]),
        ("containers", ["g++", *CFLAGS, "-o", BUILD / "containers", WORKLOAD_SRC / "containers.cpp"]),
        ("churn", ["rustc", "--edition", "2021", *RUSTFLAGS, "-o", BUILD / "churn", WORKLOAD_SRC / "churn.rs"]),
    ]
    for name, cmd in jobs:
        cmd = [str(c) for c in cmd]
        commands.append(" ".join(c.replace(str(REPO) + "/", "") for c in cmd))
        out, src = Path(cmd[cmd.index("-o") + 1]), Path(cmd[-1])
        if newer(out, src, Path(__file__)):
            continue
        log(f"build: {' '.join(cmd)}")
        subprocess.run(cmd, check=True)
    for rows in sizes_wanted.get("sqlite3", []):
        path = sqlite_script(rows)
        if not path.exists():
            path.write_text(generate_sqlite_workload(rows))
    for kib in sizes_wanted.get("xz", []):
        path = xz_input(kib)
        if not path.exists():
            path.write_bytes(generate_text(kib * 1024))
    return commands


def generate_sqlite_workload(rows):
    """SQL for sqlite3 to run: a table filled by a recursive CTE, two indexes, aggregate
    queries, an update, a delete and a self-join. Deterministic, so its output is too."""
    return f"""CREATE TABLE t(id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, score REAL);
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})
INSERT INTO t SELECT x, (x * 7919) % 997,
    printf('name-%08d-%s', (x * 104729) % 1000003, substr('abcdefghijklmnopqrstuvwxyz', 1 + x % 20, 6)),
    (x % 1000) / 7.0
FROM c;
COMMIT;
CREATE INDEX t_grp ON t(grp);
CREATE INDEX t_name ON t(name);
SELECT grp, count(*), round(sum(score), 2) FROM t GROUP BY grp ORDER BY 3 DESC LIMIT 3;
UPDATE t SET score = score * 1.5 WHERE grp % 3 = 0;
DELETE FROM t WHERE id % 5 = 0;
SELECT count(*), round(avg(score), 4), max(name) FROM t WHERE name LIKE 'name-0%';
SELECT a.grp, count(*) FROM t a JOIN t b ON a.id = b.id + 1
    WHERE a.grp = b.grp + 1 GROUP BY a.grp ORDER BY 2 DESC, 1 LIMIT 3;
"""


def generate_text(size):
    """Pseudo-English text from a fixed 3000-word vocabulary (xorshift, fixed seed): it
    compresses about 3:1, so xz does real match-finding work."""
    s = 0x9E3779B97F4A7C15
    letters = "etaoinshrdlucmfwyp"

    def rng():
        nonlocal s
        s ^= (s << 13) & 0xFFFFFFFFFFFFFFFF
        s ^= s >> 7
        s ^= (s << 17) & 0xFFFFFFFFFFFFFFFF
        return s

    words = ["".join(letters[rng() % len(letters)] for _ in range(2 + rng() % 8)) for _ in range(3000)]
    out, n = [], 0
    while n < size:
        line = " ".join(words[rng() % len(words)] for _ in range(12)) + "\n"
        out.append(line)
        n += len(line)
    return "".join(out).encode()[:size]


# ---------------------------------------------------------------------------------------
# configurations: how each workload is run


class Config:
    """A way of running a program: natively, or under one tool of one suite."""

    def __init__(self, key, suite, tool, prefix):
        self.key = key  # "native", "valgrind:memcheck", "oxgrind:massif", "heaptrack"
        self.suite = suite
        self.tool = tool
        self.prefix = prefix
        self.available = True
        self.why_not = ""

    @property
    def label(self):
        if self.suite == "native":
            return "native"
        if self.suite == "heaptrack":
            return "heaptrack"
        return f"{self.suite} {self.tool}"


def find_oxgrind(explicit):
    """The launcher: --oxgrind, else $OXGRIND, else target/release/oxgrind in the repo, else
    $CARGO_TARGET_DIR/release/oxgrind."""
    candidates = []
    if explicit:
        candidates.append(Path(explicit))
    if os.environ.get("OXGRIND"):
        candidates.append(Path(os.environ["OXGRIND"]))
    candidates.append(REPO / "target" / "release" / "oxgrind")
    if os.environ.get("CARGO_TARGET_DIR"):
        candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / "release" / "oxgrind")
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c.resolve()
    return None


def make_configs(oxgrind):
    configs = [Config("native", "native", None, [])]
    for tool in TOOLS:
        opts = TOOL_OPTIONS.get(tool, [])
        configs.append(Config(f"valgrind:{tool}", "valgrind", tool, ["valgrind", f"--tool={tool}", *opts]))
        ox = Config(f"oxgrind:{tool}", "oxgrind", tool, [str(oxgrind or "oxgrind"), f"--tool={tool}", *opts])
        if oxgrind is None:
            ox.available = False
            ox.why_not = "launcher not found (build it with `cargo build --release`)"
        configs.append(ox)
        if tool == "massif":
            # The heap path alone (no translation, no instruction clock): what a preload
            # profiler such as heaptrack does, so it is compared with heaptrack.
            heap = Config("oxgrind:massif-B", "oxgrind", HEAP_PATH,
                          [str(oxgrind or "oxgrind"), "--tool=massif", "--time-unit=B"])
            heap.available, heap.why_not = ox.available, ox.why_not
            configs.append(heap)
    configs.append(Config("heaptrack", "heaptrack", "heaptrack", ["heaptrack"]))
    return configs


# The label of Massif's heap path (`--time-unit=B`), a configuration of its own.
HEAP_PATH = "massif --time-unit=B"


def groups_of(configs):
    """The tool configurations in groups that run back to back in every round: Valgrind's
    and oxgrind's runs of one tool (their ratio is taken per round, see `paired`), the heap
    path with heaptrack."""
    groups = []
    for tool in TOOLS:
        g = [c for c in configs if c.tool == tool and c.suite in ("valgrind", "oxgrind")]
        if g:
            groups.append(g)
    g = [c for c in configs if c.tool in (HEAP_PATH, "heaptrack")]
    if g:
        groups.append(g)
    return groups


def probe(configs, timeout):
    """Runs the trivial probe program under every configuration. One that does not exit 0
    with the probe's line on stdout is marked unavailable, with the first line of what it
    said: tools that oxgrind has not implemented yet exit non-zero with a message."""
    for cfg in configs:
        if not cfg.available:
            continue
        exe = cfg.prefix[0] if cfg.prefix else None
        if exe and not (os.path.isabs(exe) or shutil.which(exe)):
            cfg.available, cfg.why_not = False, f"{exe} not installed (run bench/setup.sh)"
            continue
        r = run_once(cfg.prefix + [str(BUILD / "trivial")], timeout=timeout, keep_stdout=True)
        if r["status"] != "ok" or b"oxgrind-bench-probe-ok" not in r["stdout"]:
            said = (r.get("stderr_tail") or "").strip().splitlines()
            cfg.available = False
            cfg.why_not = f"{r['status']}: {said[-1] if said else 'no message'}"[:200]
        log(f"probe {cfg.label}: {'works' if cfg.available else 'n/a (' + cfg.why_not + ')'}")


# ---------------------------------------------------------------------------------------
# measuring one run


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class TreeSampler(threading.Thread):
    """Samples VmHWM (the kernel's own peak-RSS mark) of every process under the run's
    bench/spawn every 20 ms. Used for heaptrack, whose program and heaptrack_interpret are separate
    processes, to tell their peaks apart. A sample can miss growth in a process's last
    20 ms, so these figures are lower bounds; the headline peak comes from wait4."""

    def __init__(self, sid):
        super().__init__(daemon=True)
        self.sid = sid
        self.peaks = {}  # pid -> (name, kib)
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.02)

    def sample(self):
        # Walk the tree down from the session leader through /proc/PID/task/TID/children:
        # a few small reads, instead of scanning all of /proc, so that the sampling itself
        # takes little CPU from the run it measures.
        todo, seen = [str(self.sid)], set()
        while todo:
            pid = todo.pop()
            if pid in seen:
                continue
            seen.add(pid)
            try:
                for tid in os.listdir(f"/proc/{pid}/task"):
                    todo.extend(Path(f"/proc/{pid}/task/{tid}/children").read_text().split())
                name, hwm = None, None
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("Name:"):
                        name = line.split(None, 1)[1]
                    elif line.startswith("VmHWM:"):
                        hwm = int(line.split()[1])
            except (OSError, ValueError, IndexError):
                continue  # the process exited while we looked
            if name and hwm is not None and pid != str(self.sid):  # not bench/spawn itself
                old = self.peaks.get(pid, (name, 0))
                self.peaks[pid] = (name, max(old[1], hwm))


def run_once(cmd, timeout, keep_stdout=False, sample_tree=False, cpu_limit=None):
    """Runs cmd once through bench/spawn.c, in a fresh empty directory, stdin from
    /dev/null, stdout to a file outside that directory, stderr into it. Returns wall time,
    CPU time, peak RSS (as spawn measured them), the bytes the run left in its directory
    (tool output files plus stderr), and a status."""
    runs_dir = BUILD / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    rundir = Path(tempfile.mkdtemp(prefix="run-", dir=runs_dir))
    stdout_path = rundir.with_suffix(".stdout")
    measured_path = rundir.with_suffix(".rusage")
    env = dict(os.environ, **RUN_ENV_EXTRA)
    timed_out = threading.Event()
    with open(os.devnull, "rb") as devnull, open(stdout_path, "wb") as out, \
            open(rundir / "stderr.txt", "wb") as err:
        try:
            def limit_cpu():
                # Per process, inherited through fork and exec: SIGXCPU once a process has
                # used `cpu_limit` seconds of CPU, SIGKILL 5 s later.
                if cpu_limit:
                    lim = int(math.ceil(cpu_limit))
                    resource.setrlimit(resource.RLIMIT_CPU, (lim, lim + 5))

            p = subprocess.Popen([str(BUILD / "spawn"), str(measured_path), *cmd], cwd=rundir,
                                 stdin=devnull, stdout=out, stderr=err, env=env,
                                 start_new_session=True, preexec_fn=limit_cpu)
        except OSError as e:
            shutil.rmtree(rundir, ignore_errors=True)
            stdout_path.unlink(missing_ok=True)
            return {"status": f"cannot start: {e}", "stdout": b""}
        sampler = TreeSampler(p.pid) if sample_tree else None
        if sampler:
            sampler.start()

        def kill():
            if p.returncode is not None:
                return  # already reaped: its pid, and so its group id, may be reused
            timed_out.set()
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass

        timer = threading.Timer(timeout, kill)
        timer.start()
        p.wait()
        timer.cancel()
        if sampler:
            sampler.stop.set()
            sampler.join()
    measured = None
    try:
        fields = measured_path.read_text().split()
        measured = [int(x) for x in fields[:5]]
    except (OSError, ValueError):
        pass
    if timed_out.is_set():
        status = "timeout"
    elif measured is None:
        status = f"spawn failed ({p.returncode})"
    elif os.WIFSIGNALED(measured[4]) and cpu_limit and \
            os.WTERMSIG(measured[4]) in (signal.SIGXCPU, signal.SIGKILL):
        status = "too slow"
    elif os.WIFSIGNALED(measured[4]):
        status = f"signal {os.WTERMSIG(measured[4])}"
    elif os.WEXITSTATUS(measured[4]) != 0:
        status = f"exit {os.WEXITSTATUS(measured[4])}"
    else:
        status = "ok"
    err_bytes = (rundir / "stderr.txt").read_bytes()
    files, out_bytes = 0, 0
    for root, _, names in os.walk(rundir):
        for n in names:
            size = os.path.getsize(os.path.join(root, n))
            if size or n != "stderr.txt":  # an empty stderr is not an output file
                files += 1
            out_bytes += size
    result = {"status": status, "stdout": stdout_path.read_bytes()}
    if measured:
        result.update({
            "wall_s": measured[0] / 1e9,
            "cpu_s": (measured[1] + measured[2]) / 1e6,
            "maxrss_kib": measured[3],
            "output_bytes": out_bytes,
            "output_files": files,
        })
    if status != "ok":
        result["stderr_tail"] = err_bytes[-600:].decode(errors="replace")
    if sampler:
        result["tree_peaks_kib"] = sorted(sampler.peaks.values(), key=lambda x: -x[1])
    shutil.rmtree(rundir, ignore_errors=True)
    stdout_path.unlink(missing_ok=True)
    measured_path.unlink(missing_ok=True)
    if not keep_stdout:
        result.pop("stdout")
    return result


# ---------------------------------------------------------------------------------------
# the benchmark loop


def measure(workloads, configs, mode, runs, timeout, after_each=lambda results: None):
    """For each workload: one discarded native warm-up run, then `runs` rounds. A round runs
    every group of configurations (`groups_of`: Valgrind's and oxgrind's run of one tool),
    each group right after a native run and its members back to back, first one first and
    then the other (alternating between rounds); each round starts one group later than the
    one before. So the two runs whose ratio is taken ran next to each other, under the same
    machine load, and native runs are spread over the whole measuring period."""
    results = {}
    active = [c for c in configs if c.available]
    native = next(c for c in active if c.key == "native")
    groups = [[c for c in g if c.available] for g in groups_of(active)]
    groups = [g for g in groups if g] or [[]]
    for w in workloads:
        size = w.sizes[mode]
        argv = w.argv(size)
        log(f"== {w.name} ({size} {w.unit}): {' '.join(argv)}")
        warm = run_once(argv, timeout, keep_stdout=True)
        reference = warm["stdout"]
        if warm["status"] != "ok":
            log(f"   native run failed: {warm['status']} {warm.get('stderr_tail', '')}")
        # A tool run that takes more than SLOWEST times native's CPU time is not worth
        # waiting for. CPU, not wall time: on a shared machine wall time says more about the
        # other work than about the run.
        limit = max(10.0, SLOWEST * warm.get("cpu_s", timeout))
        per = {c.key: [] for c in active}
        given_up = set()
        for r in range(runs):
            k = r % len(groups)
            order = []
            for g in groups[k:] + groups[:k]:
                order += [native] + (g if r % 2 == 0 else g[::-1])
            for cfg in order:
                if cfg.key in given_up:
                    continue
                res = run_once(cfg.prefix + argv, timeout, keep_stdout=True,
                               sample_tree=(cfg.suite == "heaptrack"),
                               cpu_limit=limit if cfg is not native else None)
                # The tool must not change what the program prints (heaptrack adds its own
                # lines around it, hence "contains" rather than "equals").
                if res["status"] == "ok" and reference and reference not in res["stdout"]:
                    res["status"] = "wrong output"
                res.pop("stdout", None)
                res["round"] = r
                per[cfg.key].append(res)
                if res["status"] != "ok" and cfg is not native:
                    given_up.add(cfg.key)  # a failure or a timeout: no need to see it again
                log(f"   {cfg.label:30} round {r + 1}: {res['status']:>8} {res.get('wall_s', 0):8.3f} s "
                    f"{res.get('cpu_s', 0):8.3f} s CPU {res.get('maxrss_kib', 0) / 1024:8.1f} MiB")
        results[w.name] = {"size": size, "unit": w.unit, "argv": argv, "runs": per,
                           "cpu_limit_s": limit}
        after_each(results)
    return results


def paired(wres, ours_key, theirs_key, field):
    """The median over rounds of ours ÷ theirs, each ratio from the two runs of one round
    (made back to back), or None unless every round has both."""
    ours = {r["round"]: r for r in wres["runs"].get(ours_key, []) if r["status"] == "ok"}
    theirs = {r["round"]: r for r in wres["runs"].get(theirs_key, []) if r["status"] == "ok"}
    rounds = sorted(set(ours) & set(theirs))
    if not rounds or len(rounds) != len(wres["runs"].get(ours_key, [])):
        return None
    return statistics.median(ours[i][field] / theirs[i][field] for i in rounds)


# Start-up: a short program that prints, under every tool. Not a workload (its native run
# takes milliseconds, so only a ratio to the same suite's `--tool=none` means anything): it
# shows what a tool adds before and after the program's own work (translating the code the
# program reaches, the tool's report at exit), the cost a user pays on every short run.
STARTUP_PROGRAMS = [
    ("hello (C)", lambda: [BUILD / "trivial"]),
    ("python3 -c print", lambda: [PYTHON, "-c", "print('hello')"]),
]
STARTUP_ROUNDS = 7


def measure_startup(configs, timeout):
    """Each round runs every program under every tool configuration of each suite, the
    suite's `none` first; per (program, configuration) the median CPU time over the rounds
    and the median over rounds of its ratio to `none`'s in the same round."""
    tools = [c for c in configs if c.available and c.suite in ("valgrind", "oxgrind")
             and c.tool in TOOLS]
    out = {}
    for name, argv in STARTUP_PROGRAMS:
        argv = [str(a) for a in argv()]
        log(f"== start-up: {' '.join(argv)}")
        runs = {c.key: [] for c in tools}
        for r in range(STARTUP_ROUNDS):
            for c in sorted(tools, key=lambda c: (c.suite, c.tool != "none")):
                res = run_once(c.prefix + argv, timeout)
                runs[c.key].append(res)
        rows = {}
        for c in tools:
            ok = [x for x in runs[c.key] if x["status"] == "ok"]
            if len(ok) != STARTUP_ROUNDS:
                bad = next(x for x in runs[c.key] if x["status"] != "ok")
                rows[c.key] = {"status": bad["status"]}
                continue
            row = {"status": "ok", "cpu_s": statistics.median(x["cpu_s"] for x in ok),
                   "wall_s": statistics.median(x["wall_s"] for x in ok)}
            none = runs.get(f"{c.suite}:none")
            if none and all(x["status"] == "ok" for x in none):
                row["vs_none_cpu"] = statistics.median(
                    x["cpu_s"] / max(n["cpu_s"], 1e-3) for x, n in zip(ok, none))
            rows[c.key] = row
            log(f"   {c.label:30} {row['cpu_s'] * 1000:7.1f} ms CPU"
                + (f" {row['vs_none_cpu']:5.2f}x none" if "vs_none_cpu" in row else ""))
        out[name] = {"argv": argv, "rows": rows}
    return out


def summarize(results, configs):
    """Medians per (workload, configuration), and ratios to the native medians."""
    summary = {}
    for wname, wres in results.items():
        rows = {}
        for cfg in configs:
            runs = wres["runs"].get(cfg.key)
            if not cfg.available or runs is None:
                rows[cfg.key] = {"status": "n/a"}
                continue
            bad = [r["status"] for r in runs if r["status"] != "ok"]
            if bad:
                first = next(r for r in runs if r["status"] != "ok")
                rows[cfg.key] = {"status": bad[0], "detail": first.get("stderr_tail", "")}
                continue
            row = {
                "status": "ok",
                "wall_s": statistics.median(r["wall_s"] for r in runs),
                "wall_min_s": min(r["wall_s"] for r in runs),
                "wall_max_s": max(r["wall_s"] for r in runs),
                "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                "maxrss_kib": statistics.median(r["maxrss_kib"] for r in runs),
                "output_bytes": statistics.median(r["output_bytes"] for r in runs),
                "output_files": max(r["output_files"] for r in runs),
                "runs": len(runs),
            }
            if any("tree_peaks_kib" in r for r in runs):
                row["tree_peaks_kib"] = runs[len(runs) // 2].get("tree_peaks_kib")
            rows[cfg.key] = row
        native = rows.get("native", {})
        for row in rows.values():
            if row["status"] == "ok" and native.get("status") == "ok":
                row["wall_x"] = row["wall_s"] / native["wall_s"]
                row["rss_x"] = row["maxrss_kib"] / native["maxrss_kib"]
                row["cpu_x"] = row["cpu_s"] / max(native["cpu_s"], 1e-3)
        for row in rows.values():
            if row["status"] == "ok":
                row["parallel"] = row["cpu_s"] / row["wall_s"]
        for tool in TOOLS:
            ours = rows.get(f"oxgrind:{tool}")
            if ours is None or ours["status"] != "ok":
                continue
            for field in ("wall_s", "cpu_s"):
                v = paired(wres, f"oxgrind:{tool}", f"valgrind:{tool}", field)
                if v is not None:
                    ours[f"vs_valgrind_{field[:-2]}"] = v
        heap = rows.get("oxgrind:massif-B")
        if heap and heap["status"] == "ok":
            for field in ("wall_s", "cpu_s"):
                v = paired(wres, "oxgrind:massif-B", "heaptrack", field)
                if v is not None:
                    heap[f"vs_heaptrack_{field[:-2]}"] = v
        summary[wname] = rows
    return summary


# ---------------------------------------------------------------------------------------
# describing the machine


def cmd_output(cmd):
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        text = (r.stdout or r.stderr).strip()
        return text.splitlines()[0] if text else "?"
    except (OSError, subprocess.SubprocessError):
        return "not installed"


def machine_info(oxgrind):
    cpu, flags = "?", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu == "?":
                cpu = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    try:
        debian = Path("/etc/debian_version").read_text().strip()
    except OSError:
        debian = "?"
    commit = cmd_output(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    if oxgrind:
        built = datetime.datetime.fromtimestamp(oxgrind.stat().st_mtime, datetime.timezone.utc)
        ox = f"`{oxgrind}`, built {built:%Y-%m-%d %H:%M} UTC; repository HEAD when the run started: {commit}"
    else:
        ox = f"not built; repository HEAD when the run started: {commit}"
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "virtualized": " hypervisor" in flags,
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "kernel": platform.release(),
        "debian": debian,
        "glibc": os.confstr("CS_GNU_LIBC_VERSION") if hasattr(os, "confstr") else "?",
        "versions": {
            "valgrind": cmd_output(["valgrind", "--version"]),
            "heaptrack": cmd_output(["heaptrack", "--version"]),
            "gcc": cmd_output(["gcc", "--version"]),
            "rustc": cmd_output(["rustc", "--version"]),
            "python3": cmd_output([PYTHON, "--version"]),
            "sqlite3": cmd_output([SQLITE, "--version"]).split(" 20")[0],
            "xz": cmd_output([XZ, "--version"]),
            "oxgrind": ox,
        },
    }


def loadavg():
    try:
        return Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        return ["?", "?", "?"]


# ---------------------------------------------------------------------------------------
# the report


def fmt_time(s):
    return f"{s * 1000:.0f} ms" if s < 1 else f"{s:.2f} s"


def fmt_bytes(b):
    if b < 1024:
        return f"{b:.0f} B"
    if b < 1024 * 1024:
        return f"{b / 1024:.1f} KiB"
    return f"{b / 1024 / 1024:.1f} MiB"


def fmt_x(x):
    return f"{x:.1f}×" if x < 100 else f"{x:.0f}×"


def cell(row, key):
    if row["status"] == "n/a":
        return "n/a"
    if row["status"] != "ok":
        return row["status"]
    return fmt_x(row[key]) if key in row else "?"


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def render_markdown(meta, summary, configs, workloads):
    shown = [c for c in configs if c.key != "native"]
    m = meta["machine"]
    out = []
    w = out.append
    w("# Benchmarks: oxgrind, Valgrind and heaptrack side by side\n")
    w("How much slower a program runs, and how much more memory it takes, under each memory tool, "
      "measured on one machine in one run. This page is generated by `bench/run.py`; every number "
      "below comes from the run described here, and you can reproduce it (see the end of the page).\n")
    w(f"* Date: {meta['date']}")
    w(f"* Command: `{meta['command']}` ({meta['mode']} mode, {meta['runs']} run{'s' if meta['runs'] != 1 else ''} per "
      f"configuration, medians; took {meta['elapsed_s'] / 60:.1f} minutes)")
    w(f"* Machine: {m['nproc']} CPUs ({m['cpu']}{', virtual machine' if m['virtualized'] else ''}), "
      f"{m['memory_gib']} GiB RAM, Linux {m['kernel']}, Debian {m['debian']}, {m['glibc']}")
    vers = m["versions"]
    w(f"* Versions: {vers['valgrind']}; heaptrack {vers['heaptrack'].split()[-1]}; {vers['gcc']}; "
      f"{vers['rustc']}; {vers['python3']}; sqlite {vers['sqlite3']}; {vers['xz']}")
    w(f"* oxgrind: {vers['oxgrind']}")
    la0, la1 = meta["loadavg_before"], meta["loadavg_after"]
    # Other work: a 1-minute load above 1 when the run started (the 5- and 15-minute ones
    # still remember what finished before), or above 2 on any average at the end (the
    # benchmark itself keeps up to two cores busy: `threads` and `churn` have two threads).
    busy = ((la0[0] != "?" and float(la0[0]) > 1.0)
            or max((float(x) for x in la1 if x != "?"), default=0.0) > 2.0)
    w(f"* Load average (1, 5, 15 min) before: {' '.join(la0)}; after: {' '.join(la1)}."
      + (" **The machine was shared with other work (concurrent builds) while measuring**, so wall "
         "times are noisier than on an idle machine; CPU time (user+system) is less affected."
         if busy else " The machine was otherwise idle."))
    missing = [c for c in configs if not c.available]
    works = [c.label for c in configs if c.available and c.suite == "oxgrind"]
    w(f"* oxgrind tools that worked in this run: {', '.join(works) if works else 'none'}.")
    if missing:
        w("* Not available in this run (shown as n/a):")
        for c in missing:
            w(f"  * {c.label}: {c.why_not}")
    if meta.get("notes"):
        w("* Notes from whoever ran it:")
        for n in meta["notes"]:
            w(f"  * {n}")
    w("")

    def gm_of(cfg_key, key):
        xs = [summary[wl.name].get(cfg_key, {}).get(key) for wl in workloads]
        return geomean(xs) if all(x is not None for x in xs) else None

    w("## Headlines\n")
    w(f"Geometric means over the {len(workloads)} workloads of the ratios to native: wall time, "
      "CPU time (user+system), peak RSS.\n")
    for tool in TOOLS + [HEAP_PATH, "heaptrack"]:
        parts = []
        for c in configs:
            if c.tool != tool:
                continue
            wx, cx, rx = gm_of(c.key, "wall_x"), gm_of(c.key, "cpu_x"), gm_of(c.key, "rss_x")
            if not c.available:
                parts.append(f"{c.label} n/a")
            elif wx is None:
                parts.append(f"{c.label} incomplete (a run failed; see below)")
            else:
                parts.append(f"{c.label} **{fmt_x(wx)}** wall, {fmt_x(cx)} CPU, {fmt_x(rx)} memory")
        if parts:
            w("* " + "; ".join(parts))
    w("")
    w("oxgrind against Valgrind, tool by tool: the geometric mean over the workloads of the "
      "median, over rounds, of oxgrind's time ÷ Valgrind's time in the same round (below 1: "
      "oxgrind is faster).\n")
    for tool in TOOLS:
        key = f"oxgrind:{tool}"
        if not any(c.key == key and c.available for c in configs):
            continue
        wv, cv = gm_of(key, "vs_valgrind_wall"), gm_of(key, "vs_valgrind_cpu")
        if wv is None:
            w(f"* {tool}: incomplete (a run failed or timed out; see below)")
        else:
            w(f"* {tool}: **{wv:.2f}** of Valgrind's wall time, {cv:.2f} of its CPU time")
    hv = gm_of("oxgrind:massif-B", "vs_heaptrack_wall")
    if hv is not None:
        w(f"* {HEAP_PATH} against heaptrack: **{hv:.2f}** of its wall time, "
          f"{gm_of('oxgrind:massif-B', 'vs_heaptrack_cpu'):.2f} of its CPU time")
    w("")

    def matrix(title, key, explain):
        w(f"## {title}\n")
        w(explain + "\n")
        w("| workload | native | " + " | ".join(c.label for c in shown) + " |")
        w("|---|---:|" + "---:|" * len(shown))
        per_cfg = {c.key: [] for c in shown}
        for wl in workloads:
            rows = summary[wl.name]
            nat = rows["native"]
            if nat["status"] == "ok":
                base = (fmt_bytes(nat["maxrss_kib"] * 1024) if key == "rss_x"
                        else fmt_time(nat["cpu_s" if key == "cpu_x" else "wall_s"]))
            else:
                base = nat["status"]
            cells = []
            for c in shown:
                cells.append(cell(rows[c.key], key))
                if key in rows[c.key]:
                    per_cfg[c.key].append(rows[c.key][key])
            w(f"| {wl.name} | {base} | " + " | ".join(cells) + " |")
        gm = []
        for c in shown:
            xs = per_cfg[c.key]
            gm.append(fmt_x(geomean(xs)) if xs and len(xs) == len(workloads) else "–")
        w("| **geometric mean** | | " + " | ".join(gm) + " |")
        w("")

    matrix("Slowdown: median wall time ÷ native", "wall_x",
           "The native column is the native median wall time; the others are ratios to it.")
    matrix("Memory: peak RSS ÷ native", "rss_x",
           "The native column is the native median peak RSS; the others are ratios to it. "
           "For heaptrack this is the largest single process (see Method).")

    def ratio_matrix(title, explain, pairs):
        w(f"## {title}\n")
        w(explain + "\n")
        w("| workload | " + " | ".join(label for label, _, _ in pairs) + " |")
        w("|---|" + "---:|" * len(pairs))
        cols = [[] for _ in pairs]
        for wl in workloads:
            cells = []
            for i, (_, key, field) in enumerate(pairs):
                v = summary[wl.name].get(key, {}).get(field)
                cells.append(f"{v:.2f}" if v is not None else "–")
                if v is not None:
                    cols[i].append(v)
            w(f"| {wl.name} | " + " | ".join(cells) + " |")
        w("| **geometric mean** | " + " | ".join(
            f"{geomean(c):.2f}" if c and len(c) == len(workloads) else "–" for c in cols) + " |")
        w("")

    vs = [(f"{t} wall", f"oxgrind:{t}", "vs_valgrind_wall") for t in TOOLS
          if any(c.key == f"oxgrind:{t}" and c.available for c in configs)]
    vs += [(f"{t} CPU", f"oxgrind:{t}", "vs_valgrind_cpu") for t in TOOLS
           if any(c.key == f"oxgrind:{t}" and c.available for c in configs)]
    ratio_matrix("oxgrind ÷ Valgrind, median of paired runs",
                 "Each round runs Valgrind's and oxgrind's tool back to back (which one first "
                 "alternates); each cell is the median over rounds of oxgrind's time ÷ Valgrind's "
                 "in the same round. Below 1, oxgrind is faster. – : a run failed or timed out.",
                 vs)
    if any(c.key == "oxgrind:massif-B" and c.available for c in configs):
        ratio_matrix(f"{HEAP_PATH} ÷ heaptrack, median of paired runs",
                     "Massif's heap path (no translation, time in bytes) against heaptrack, "
                     "paired in the same way.",
                     [("wall", "oxgrind:massif-B", "vs_heaptrack_wall"),
                      ("CPU", "oxgrind:massif-B", "vs_heaptrack_cpu")])

    def parallel_matrix():
        w("## Parallelism: CPU time ÷ wall time\n")
        w("Above 1, the run kept more than one core busy on average (the machine has "
          f"{meta['machine']['nproc']}; only `threads` and `churn` have more than one thread).\n")
        w("| workload | native | " + " | ".join(c.label for c in shown) + " |")
        w("|---|---:|" + "---:|" * len(shown))
        for wl in workloads:
            rows = summary[wl.name]
            cells = [f"{rows[c.key]['parallel']:.2f}" if "parallel" in rows[c.key] else cell(rows[c.key], "parallel")
                     for c in [configs[0]] + shown]
            w(f"| {wl.name} | " + " | ".join(cells) + " |")
        w("")

    matrix("CPU time: median user+system time ÷ native", "cpu_x",
           "Less sensitive than wall time to other work on the machine, but blind to waiting: "
           "Valgrind runs one thread at a time, which costs wall time, not CPU time. "
           "For heaptrack it includes the interpreter and the compressor.")
    parallel_matrix()

    w("## Each workload\n")
    for wl in workloads:
        res = meta["workloads"][wl.name]
        w(f"### {wl.name} ({wl.lang}): {wl.what}\n")
        w(f"`{' '.join(a.replace(str(REPO) + '/', '') for a in res['argv'])}` "
          f"({res['size']} {res['unit']})\n")
        w("| run | wall (median) | × native | CPU user+sys | peak RSS | × native | output |")
        w("|---|---:|---:|---:|---:|---:|---:|")
        notes = []
        for c in configs:
            row = summary[wl.name][c.key]
            if row["status"] != "ok":
                w(f"| {c.label} | {row['status']} | | | | | |")
                if row["status"] == "timeout":
                    notes.append(f"{c.label}: killed after the {meta['timeout_s']:g} s timeout")
                elif row["status"] == "too slow":
                    notes.append(f"{c.label}: stopped after {SLOWEST}× native's CPU time "
                                 f"({res.get('cpu_limit_s', 0):.0f} s)")
                elif row["status"] != "n/a" and row.get("detail"):
                    last = row["detail"].strip().splitlines()[-1:] or [""]
                    notes.append(f"{c.label}: {row['status']}: `{last[0][:160]}`")
                continue
            wx = fmt_x(row["wall_x"]) if "wall_x" in row else "?"
            rx = fmt_x(row["rss_x"]) if "rss_x" in row else "?"
            outp = "–" if c.suite == "native" else (
                f"{fmt_bytes(row['output_bytes'])} in {row['output_files']} file"
                f"{'s' if row['output_files'] != 1 else ''}")
            w(f"| {c.label} | {fmt_time(row['wall_s'])} | {wx} | {fmt_time(row['cpu_s'])} | "
              f"{fmt_bytes(row['maxrss_kib'] * 1024)} | {rx} | {outp} |")
            if row.get("tree_peaks_kib"):
                program = Path(res["argv"][0]).name[:15]  # the kernel's comm is 15 bytes
                parts = []
                for n, k in row["tree_peaks_kib"]:
                    if n == program:
                        parts.append(f"the program ({n}) {fmt_bytes(k * 1024)}")
                    elif n == "heaptrack_inter":
                        parts.append(f"heaptrack_interpret {fmt_bytes(k * 1024)}")
                    elif n == "zstd":
                        parts.append(f"zstd {fmt_bytes(k * 1024)}")
                notes.append(f"{c.label}, peak RSS per process (VmHWM sampled every 20 ms): "
                             + ", ".join(parts))
        w("")
        for n in notes:
            w(f"* {n}")
        if notes:
            w("")

    if meta.get("startup"):
        tools = [t for t in TOOLS if t != "none"]
        w("## Start-up: a short program that prints\n")
        w(f"CPU time (user+system, median of {STARTUP_ROUNDS} rounds) of a program that prints one "
          "line and exits, and in parentheses its ratio to the same suite's `--tool=none` in the "
          "same round (median over rounds): what each tool adds to every short run (translating "
          "the code the program reaches, the tool's output at exit).\n")
        w("| program | suite | none | " + " | ".join(tools) + " |")
        w("|---|---|---:|" + "---:|" * len(tools))
        for name, res in meta["startup"].items():
            for suite in ("oxgrind", "valgrind"):
                cells = []
                for t in ["none"] + tools:
                    row = res["rows"].get(f"{suite}:{t}")
                    if row is None:
                        cells.append("n/a")
                    elif row["status"] != "ok":
                        cells.append(row["status"])
                    else:
                        x = f" ({row['vs_none_cpu']:.2f}×)" if t != "none" and "vs_none_cpu" in row else ""
                        cells.append(f"{row['cpu_s'] * 1000:.0f} ms{x}")
                w(f"| {name} | {suite} | " + " | ".join(cells) + " |")
        w("")

    w("## Method\n")
    w(f"""* **Configurations.** Each workload runs natively; under Valgrind's memcheck (`--leak-check=full`),
  massif, dhat, cachegrind (3.19's defaults, which include the cache simulation) and none; under the
  oxgrind tool of the same name with the same options, where that tool works; and under `heaptrack`
  (1.4, default options: LD_PRELOAD library, `heaptrack_interpret` in a second process, zstd output).
  Before measuring, `bench/run.py` runs a trivial program (`bench/workloads/trivial.c`) under each
  configuration; one that does not exit 0 with the program's output is shown as n/a, with its message.
* **Alternation and pairing.** After one discarded native warm-up run per workload, each round
  runs every configuration once, in groups: a native run, then Valgrind's and oxgrind's run of
  the same tool back to back (which one goes first alternates between rounds); the heap path
  (`oxgrind --tool=massif --time-unit=B`) is paired with heaptrack. Each round starts one group
  later than the previous one. Slowdown tables show medians over the rounds (for native, over
  all its runs); the oxgrind ÷ Valgrind tables take the ratio within each round first, so both
  sides of a ratio ran under the same load, then the median over rounds. Geometric means are
  over the workloads. A run is stopped once it has used {SLOWEST}× its workload's native CPU
  time (`RLIMIT_CPU`) and shown as "too slow"; the mode's wall-time timeout is a backstop. On a
  virtual machine the kernel's CPU limit also counts time the hypervisor stole, so a run can be
  stopped while its reported user+system time is still 10-20% below the limit.
* **Measuring**: every run goes through `bench/spawn.c`, a small C program that forks, execs the
  command and `wait4`s for it (like GNU time, but with a monotonic nanosecond clock). It exists
  because Linux folds the memory image a process had before `execve` into its peak RSS, and a
  child forked from the Python runner would start with the runner's ~18 MiB.
* **Wall time**: from just before `fork` to the return of `wait4` on the child (`CLOCK_MONOTONIC`).
  **CPU**: user+system time from the same `wait4`, which includes the child's waited-for
  descendants (heaptrack's interpreter and compressor).
* **Peak RSS**: `ru_maxrss` from `wait4` on the direct child. Linux reports there the largest
  peak of the child and of every descendant it waited for; it is a maximum over processes, not a
  sum. Valgrind runs itself and the program in one process, so its figure is the program plus
  Valgrind. The native figure and oxgrind's (an LD_PRELOAD runtime inside the program) are the
  program's process. heaptrack is a shell script: the program (with heaptrack's preload library),
  `heaptrack_interpret` and `zstd` are separate processes that run at the same time, and the table
  shows the largest of them; the per-process peaks listed under each workload are the kernel's
  VmHWM sampled every 20 ms (lower bounds), to tell the program from the interpreter.
* **Output**: the total size of the files the run left in its working directory (a new empty
  directory per run: massif.out.PID, dhat.out.PID, cachegrind.out.PID, heaptrack.*.zst, ...)
  plus what it wrote on stderr (Memcheck's report). The programs' own output goes to stdout,
  elsewhere, and is checked against the native run's: a tool that changes it is reported as
  "wrong output".
* **Workloads**: written for this project (`bench/workloads/`) and built with `{' '.join(CFLAGS)}`
  (gcc/g++) and `{' '.join(RUSTFLAGS)}` (rustc), with frame pointers omitted, as Debian builds its
  packages; plus Debian's own `python3`, `sqlite3` and `xz` binaries, run by absolute path. Inputs
  for sqlite3 and xz are generated deterministically by `bench/run.py`. Every workload is sized
  for a native run of at least 0.3 s of CPU in quick mode (about 1 s in full mode), so that no
  tool's fixed start-up cost (Valgrind's is about 0.3 s) decides a ratio.
* No number here is checked by any test: the suite measures, it does not assert.
""")
    w("## Reproduce\n")
    w("```sh\ncargo build --release            # the oxgrind launcher and runtime, into target/release\n"
      "bench/setup.sh                   # Valgrind, heaptrack, sqlite3, xz-utils, zstd, gcc, g++ from Debian\n"
      "python3 bench/run.py --quick     # about an hour on 2 CPUs; --full for the long run (several hours)\n"
      "python3 bench/run.py --quick --write-docs   # also rewrites this page\n```\n")
    w("Other options: `--only alloc,xz` (workloads), `--configs native,valgrind:memcheck,oxgrind:memcheck`,"
      " `--runs N`, `--oxgrind PATH` (or `$OXGRIND`), `--json PATH`. Raw per-run results of the last run are "
      "in `bench/build/results-MODE.json`.")
    return "\n".join(out) + "\n"


def print_summary(summary, configs, workloads):
    shown = [c for c in configs if c.available]
    print("\nslowdown (× native wall) / peak RSS (× native):")
    print(f"{'workload':12}" + "".join(f"{c.label[:18]:>20}" for c in shown))
    for wl in workloads:
        rows = summary[wl.name]
        line = f"{wl.name:12}"
        for c in shown:
            r = rows[c.key]
            if r["status"] != "ok":
                line += f"{r['status'][:18]:>20}"
            elif c.key == "native":
                line += f"{fmt_time(r['wall_s']) + ' ' + fmt_bytes(r['maxrss_kib'] * 1024):>20}"
            else:
                line += f"{fmt_x(r['wall_x']) + ' / ' + fmt_x(r['rss_x']):>20}"
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_const", dest="mode", const="quick",
                      help="native runs of at least 0.3 s, 3 runs: about an hour on 2 CPUs (default)")
    mode.add_argument("--full", action="store_const", dest="mode", const="full",
                      help="native runs of about 1 s, 5 runs each")
    ap.add_argument("--runs", type=int, help="runs per configuration (default: 3 quick, 5 full)")
    ap.add_argument("--only", help="comma-separated workloads: " + ",".join(w.name for w in WORKLOADS))
    ap.add_argument("--configs", help="comma-separated configurations, e.g. native,valgrind:massif,"
                    "oxgrind:massif,heaptrack (native is always included)")
    ap.add_argument("--oxgrind", help="path of the oxgrind launcher (default: $OXGRIND, then "
                    "target/release/oxgrind)")
    ap.add_argument("--timeout", type=float, help="seconds before one run is killed")
    ap.add_argument("--note", action="append", default=[], metavar="TEXT",
                    help="a sentence for the page's notes (repeatable), e.g. what a tool does not "
                    "do yet at this commit")
    ap.add_argument("--startup", action=argparse.BooleanOptionalAction, default=None,
                    help="also measure a short printing program's start-up under every tool "
                    "(default: on, off with --only)")
    ap.add_argument("--json", help="where to write raw results (default bench/build/results-MODE.json)")
    ap.add_argument("--write-docs", nargs="?", const=str(REPO / "docs" / "benchmarks.md"),
                    metavar="PATH", help="write the results page (default docs/benchmarks.md)")
    args = ap.parse_args()
    mode = args.mode or "quick"
    runs = args.runs or MODES[mode]["runs"]
    timeout = args.timeout or MODES[mode]["timeout"]
    if runs < 1:
        ap.error("--runs must be at least 1")

    workloads = WORKLOADS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in {w.name for w in WORKLOADS}]
        if unknown:
            ap.error(f"unknown workload(s): {', '.join(unknown)}")
        workloads = [w for w in WORKLOADS if w.name in names]

    started = time.time()
    la_before = loadavg()
    build_cmds = build_workloads({w.name: [w.sizes[mode]] for w in workloads})
    oxgrind = find_oxgrind(args.oxgrind)
    configs = make_configs(oxgrind)
    if args.configs:
        keep = {k.strip() for k in args.configs.split(",")} | {"native"}
        unknown = keep - {c.key for c in configs}
        if unknown:
            ap.error(f"unknown configuration(s): {', '.join(sorted(unknown))}")
        configs = [c for c in configs if c.key in keep]
    probe(configs, timeout=60)
    machine = machine_info(oxgrind)

    command = f"python3 bench/run.py --{mode}"
    for flag, value in (("--runs", args.runs), ("--only", args.only), ("--configs", args.configs),
                        ("--timeout", args.timeout)):
        if value:
            command += f" {flag} {value:g}" if isinstance(value, float) else f" {flag} {value}"
    json_path = Path(args.json) if args.json else BUILD / f"results-{mode}.json"

    def publish(results, final):
        """Writes the JSON (and the page) for the workloads measured so far: after each
        workload, so that a run cut short still leaves its finished workloads' numbers."""
        done = [w for w in workloads if w.name in results]
        summary = summarize(results, configs)
        elapsed = time.time() - started
        notes = list(args.note)
        if not final:
            notes.append(f"Partial run: {len(done)} of {len(workloads)} workloads measured so far.")
        meta = {
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": command,
            "mode": mode,
            "runs": runs,
            "timeout_s": timeout,
            "elapsed_s": elapsed,
            "loadavg_before": la_before,
            "loadavg_after": loadavg(),
            "machine": machine,
            "build_commands": build_cmds,
            "notes": notes,
            "startup": startup,
            "configs": {c.key: {"available": c.available, "why_not": c.why_not,
                                "argv_prefix": c.prefix} for c in configs},
            "workloads": {k: {x: v[x] for x in ("size", "unit", "argv", "cpu_limit_s")} for k, v in results.items()},
        }
        json_path.write_text(json.dumps({"meta": meta, "summary": summary, "runs": results},
                                        indent=1, default=str))
        if args.write_docs and done:
            Path(args.write_docs).write_text(render_markdown(meta, summary, configs, done))
        return summary, elapsed, done

    want_startup = args.startup if args.startup is not None else not args.only
    startup = measure_startup(configs, timeout) if want_startup else None

    results = measure(workloads, configs, mode, runs, timeout,
                      after_each=lambda r: publish(r, final=False))
    summary, elapsed, done = publish(results, final=True)
    print_summary(summary, configs, done)
    print(f"\nraw results: {json_path}  ({elapsed / 60:.1f} min)")
    if args.write_docs:
        print(f"wrote {args.write_docs}")

if __name__ == "__main__":
    main()
