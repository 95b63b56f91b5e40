"""Summarises an `ncu --csv --page raw --metrics gpu__time_duration.sum` log of one training step:
time per kernel name (total, calls, share), longest first, and the step's kernel total.

Usage: python3 bench/tools/ncu_summary.py LOG.csv [--top N]
"""

import argparse
import collections
import csv
import io


def rows(path):
    text = open(path, errors="replace").read()
    # ncu prints its own lines (==PROF==) before the CSV; the CSV starts at its header.
    start = text.find('"ID"')
    reader = csv.DictReader(io.StringIO(text[start:]))
    for r in reader:
        t = r.get("gpu__time_duration.sum", "")
        try:
            yield r["Kernel Name"], float(t.replace(",", ""))
        except ValueError:
            continue  # the units row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("log")
    p.add_argument("--top", type=int, default=40)
    a = p.parse_args()
    per = collections.defaultdict(lambda: [0, 0.0])
    n, total = 0, 0.0
    for name, ns in rows(a.log):
        short = name.split("(")[0][:90]
        per[short][0] += 1
        per[short][1] += ns
        n += 1
        total += ns
    print(f"{n} kernels, {total / 1e6:.2f} ms of kernel time")
    print(f"{'ms':>8} {'%':>5} {'calls':>6}  kernel")
    for name, (c, ns) in sorted(per.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print(f"{ns / 1e6:8.3f} {100 * ns / total:5.1f} {c:6d}  {name}")


if __name__ == "__main__":
    main()
