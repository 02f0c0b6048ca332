#!/usr/bin/env python3
"""Instructions a tool adds per malloc/free pair, counted by Callgrind.

Why it exists: wall and CPU times on a shared machine move by tens of percent between runs,
so a change to the allocation path (the runtime's blocks.rs, hooks.rs, stacks.rs, a tool's
on_alloc/on_free) cannot be judged by them. Callgrind's instruction counts repeat exactly.
This runs bench/workloads/alloc.c (one free and one malloc or calloc per iteration, three
call sites) natively and with the runtime preloaded, each for 0 and for N iterations, all
under Callgrind, and prints

    (Ir(config, N) - Ir(config, B)) / (N - B) - (Ir(native, N) - Ir(native, B)) / (N - B)

the instructions oxgrind adds to one iteration. Start-up and the final report cancel out;
with a base B of a few thousand iterations (`--base`) so does the first capture and
symbolisation of each of the workload's stacks (with B = 0, the default, they are counted:
about 1,100 instructions per iteration at N = 20,000 under Massif). For a tool that runs the program under the translation
engine (memcheck, dhat, massif --time-unit=i) the number includes the engine's cost of the
program's own loop and of glibc's allocator run from the code cache, not only the hooks.

The runtime is preloaded directly (LD_PRELOAD and the launcher's OXGRIND hand-off, with the
Callgrind tool binary started without Valgrind's launcher): through `valgrind` or the
`oxgrind` launcher, the runtime would load into Valgrind's own launcher and measure it.

    python3 bench/hookcost.py [--iters N] [--base B] [--lib PATH] ["massif --time-unit=B" ...]
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
RS, US = "\x1e", "\x1f"  # the hand-off's record and list separators (oxgrind-options)
VALGRIND_LIB = "/usr/libexec/valgrind"

DEFAULT_CONFIGS = ["massif --time-unit=B", "dhat", "memcheck", "massif"]


def callgrind_ir(argv, env_extra, workdir):
    out = Path(workdir) / "callgrind.out"
    env = dict(os.environ)
    env.update(env_extra)
    env.update({"VALGRIND_LAUNCHER": "/usr/bin/valgrind", "VALGRIND_LIB": VALGRIND_LIB})
    tool = f"{VALGRIND_LIB}/callgrind-amd64-linux"
    cmd = [tool, "--tool=callgrind", f"--callgrind-out-file={out}", *argv]
    r = subprocess.run(cmd, env=env, cwd=workdir, capture_output=True, text=True, timeout=3600)
    m = re.search(r"I\s+refs:\s+([\d,]+)", r.stderr)
    if r.returncode != 0 or not m:
        sys.exit(f"hookcost: {' '.join(argv)} failed ({r.returncode}):\n{r.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--base", type=int, default=0, help="iterations of the base run [0]")
    ap.add_argument("--lib", default=str(REPO / "target/release/liboxgrind_runtime.so"))
    ap.add_argument("configs", nargs="*", default=DEFAULT_CONFIGS)
    args = ap.parse_args()
    # The programs run in a temporary directory: a relative path would not preload at all
    # (ld.so ignores it with a warning) and every cost would read as zero.
    args.lib = str(Path(args.lib).resolve())
    with tempfile.TemporaryDirectory(prefix="oxgrind-hookcost-") as work:
        prog = Path(work) / "alloc"
        subprocess.run(["gcc", "-O2", "-g", "-o", prog, BENCH / "workloads/alloc.c"], check=True)

        def per_iter(env_for):
            lo = callgrind_ir([str(prog), str(args.base)], env_for(args.base), work)
            hi = callgrind_ir([str(prog), str(args.iters)], env_for(args.iters), work)
            return (hi - lo) / (args.iters - args.base)

        native = per_iter(lambda n: {})
        print(f"native: {native:.1f} instructions per iteration (free + malloc/calloc + loop)")
        for config in args.configs:
            opts = config.split()
            opts = [f"--tool={opts[0]}", "-q", *opts[1:]]
            opts += [f"--{opts[0][7:]}-out-file=/dev/null"] if opts[0][7:] in ("massif", "dhat") else []

            def env_for(n, opts=opts):
                handoff = RS.join(["fresh", work, US.join(opts), US.join([str(prog), str(n)])])
                env = {"LD_PRELOAD": args.lib, "OXGRIND": handoff}
                if opts[0] == "--tool=memcheck":
                    env["GLIBCXX_FORCE_NEW"] = "1"
                return env

            cost = per_iter(env_for) - native
            print(f"{config}: +{cost:.1f} instructions per iteration")


if __name__ == "__main__":
    main()
