#!/usr/bin/python3
"""Writes the big inputs docs/report.md measures `oxgrind report` on: a massif.out of about
100 MB (many detailed snapshots with wide, deep trees) and a dhat.out with 100,000 program
points. Deterministic (fixed seed), so numbers can be compared between versions.

    big_inputs.py OUTDIR      -> OUTDIR/massif.out.big, OUTDIR/dhat.out.big
"""
import json
import os
import random
import sys

ROOT = "(heap allocation functions) malloc/new/new[], --alloc-fns, etc."


def massif(path, snapshots=310, sites=60, fanout=(10, 9)):
    rnd = random.Random(1)
    fn = lambda i: f"0x{0x400000 + i * 16:X}: func_{i} (src/file_{i % 97}.c:{10 + i % 500})"
    with open(path, "w") as f:
        f.write("desc: --detailed-freq=1\ncmd: ./big_program --with many arguments\ntime_unit: i\n")
        peak_at = snapshots * 2 // 3
        for s in range(snapshots):
            scale = 1 + min(s, peak_at) * 10 - max(0, s - peak_at) * 15
            lines = []
            total = 0
            for a in range(sites):
                kids = []
                site_total = 0
                for b in range(fanout[0]):
                    grand = []
                    sub = 0
                    for c in range(fanout[1]):
                        v = rnd.randint(1, 100) * scale * 8
                        grand.append((v, fn(10_000 + a * 1000 + b * 10 + c)))
                        sub += v
                    kids.append((sub, fn(1_000 + a * 10 + b), grand))
                    site_total += sub
                lines.append((site_total, fn(a), kids))
                total += site_total
            kind = "peak" if s == peak_at else "detailed"
            f.write(f"#-----------\nsnapshot={s}\n#-----------\ntime={s * 100_000}\n"
                    f"mem_heap_B={total}\nmem_heap_extra_B={total // 50}\nmem_stacks_B=0\n"
                    f"heap_tree={kind}\n")
            out = [f"n{len(lines)}: {total} {ROOT}\n"]
            for site_total, label, kids in sorted(lines, key=lambda x: -x[0]):
                out.append(f" n{len(kids)}: {site_total} {label}\n")
                for sub, klabel, grand in sorted(kids, key=lambda x: -x[0]):
                    out.append(f"  n{len(grand)}: {sub} {klabel}\n")
                    for v, glabel in sorted(grand, key=lambda x: -x[0]):
                        out.append(f"   n0: {v} {glabel}\n")
            f.write("".join(out))


def dhat(path, pps=100_000, frames=20_000, depth=8):
    rnd = random.Random(2)
    ftbl = ["[root]"] + [f"0x{0x400000 + i * 16:X}: func_{i} (src/file_{i % 97}.c:{10 + i % 500})"
                         for i in range(frames)]
    out = []
    for p in range(pps):
        fs = [1 + (p % 50)] + [1 + rnd.randrange(frames) for _ in range(depth - 1)]
        tb = rnd.randint(1, 100_000)
        tbk = rnd.randint(1, 100)
        mb = min(tb, rnd.randint(1, 50_000))
        out.append({"tb": tb, "tbk": tbk, "tl": tbk * rnd.randint(1, 10_000), "mb": mb, "mbk": 1,
                    "gb": mb // 2, "gbk": 1, "eb": 0, "ebk": 0, "rb": rnd.randint(0, tb),
                    "wb": rnd.randint(0, tb), "fs": fs})
    doc = {"dhatFileVersion": 2, "mode": "heap", "verb": "Allocated", "bklt": True, "bkacc": True,
           "tu": "instrs", "Mtu": "Minstr", "tuth": 500, "cmd": "./big_program", "pid": 1,
           "te": 10 ** 9, "tg": 5 * 10 ** 8, "pps": out, "ftbl": ftbl}
    with open(path, "w") as f:
        json.dump(doc, f)


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    massif(os.path.join(out, "massif.out.big"))
    dhat(os.path.join(out, "dhat.out.big"))
