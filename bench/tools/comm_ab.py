#!/usr/bin/env python3
"""Compares two builds of comm-bench from their logs (an A/B of the kernels on one machine):
all_reduce busbw per algorithm, block cap, dtype and size, the median over each build's logs,
as a bench/results JSON whose `peer` is the older build.

    python3 bench/tools/comm_ab.py OUT.json --commit NEW --peer-commit OLD --machine M --notes N \
        --new LOG ... --old LOG ...
"""
import argparse
import statistics

from comm_checks import parse_rows, write_results


def busbw(paths):
    """{(algo, blocks, dtype, bytes): [busbw GB/s, ...]} from comm-bench logs."""
    out = {}
    for path in paths:
        blocks = None
        for line in open(path):
            if line.startswith("# nvshmem: at most "):
                blocks = int(line.split()[4])
        for label, f in parse_rows(path):
            if f[0] == "all_reduce":
                algo = label.split("-", 1)[1] if "-" in label else "auto"
                out.setdefault((algo, blocks, f[1], int(f[2])), []).append(float(f[6]))
    return out


def size_name(b):
    for unit, n in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if b % n == 0:
            return f"{b // n}{unit}"
    return f"{b}B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--peer-commit", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--notes", default="")
    ap.add_argument("--new", nargs="+", required=True)
    ap.add_argument("--old", nargs="+", required=True)
    a = ap.parse_args()
    new, old = busbw(a.new), busbw(a.old)
    benchmarks = []
    for key in sorted(new.keys() & old.keys()):
        algo, blocks, dtype, size = key
        n, o = statistics.median(new[key]), statistics.median(old[key])
        benchmarks.append({
            "name": f"allreduce_{algo}_{blocks}blocks_{dtype}_{size_name(size)}_busbw",
            "unit": "GB/s",
            "oxtrain": round(n, 1),
            "peer": round(o, 1),
            "peer_name": f"oxtrain {a.peer_commit}",
            "ratio": round(n / o, 3),
            "runs": [len(new[key]), len(old[key])],
        })
    write_results(a.out, a, benchmarks)
    for b in benchmarks:
        print(f"  {b['name']:<44} {b['oxtrain']:>7} vs {b['peer']:>7} GB/s  ratio {b['ratio']}")


if __name__ == "__main__":
    main()
