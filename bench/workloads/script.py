"""script: what a typical Python program does with its heap.

Why: an interpreter is a real program with its own allocator (pymalloc serves small
objects from arenas, so heap tools see arenas, not objects) and a large start-up cost.
The script builds records, serialises them to JSON and back, formats text, sorts and
groups, ROUNDS times.

Usage: python3 script.py ROUNDS
"""
import json
import sys
from collections import defaultdict


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    checksum = 0
    for r in range(rounds):
        records = [
            {"id": i, "name": f"item-{i * 7919 % 10007}", "tags": [str(i % 13), str(i % 17)],
             "value": (i * 31 + r) % 1000 / 7.0}
            for i in range(5000)
        ]
        text = json.dumps(records)
        back = json.loads(text)
        groups = defaultdict(list)
        for rec in back:
            groups[rec["tags"][0]].append(rec["value"])
        summary = sorted((k, round(sum(v), 3), len(v)) for k, v in groups.items())
        lines = "\n".join(f"{k}:{s}:{n}" for k, s, n in summary)
        checksum = (checksum * 31 + len(text) + len(lines)) % (1 << 61)
    print(f"script rounds={rounds} checksum={checksum}")


if __name__ == "__main__":
    main()
