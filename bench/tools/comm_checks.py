#!/usr/bin/env python3
"""Summarises comm-bench correctness logs (every element of every result checked) into a
bench/results JSON: per log and backend label, how many results were checked and how many
elements were wrong, with the ops, dtypes and sizes covered.

    python3 bench/tools/comm_checks.py OUT.json --commit C --machine M --notes N NAME=LOG ...
"""
import argparse
import json
import datetime


def parse(path):
    """{backend label: [(op, dtype, bytes, wrong)]} from a comm-bench log."""
    runs, label = {}, None
    for line in open(path):
        if line.startswith("# backend "):
            label = line.split()[2].rstrip(",")
            runs.setdefault(label, [])
            continue
        f = line.split()
        if label and len(f) >= 8 and f[0] in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"):
            runs[label].append((f[0], f[1], int(f[2]), int(f[7])))
    return runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("logs", nargs="+", help="NAME=LOG")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--notes", default="")
    a = ap.parse_args()
    benchmarks = []
    for spec in a.logs:
        name, path = spec.split("=", 1)
        for label, rows in parse(path).items():
            benchmarks.append({
                "name": f"{name}_{label}",
                "unit": "wrong elements",
                "oxtrain": sum(r[3] for r in rows),
                "results_checked": len(rows),
                "ops": sorted({r[0] for r in rows}),
                "dtypes": sorted({r[1] for r in rows}),
                "sizes_bytes": sorted({r[2] for r in rows}),
            })
    doc = {
        "date": datetime.date.today().isoformat(),
        "commit": a.commit,
        "machine": a.machine,
        "notes": a.notes,
        "benchmarks": benchmarks,
    }
    json.dump(doc, open(a.out, "w"), indent=2)
    bad = sum(b["oxtrain"] for b in benchmarks)
    print(f"{len(benchmarks)} runs, {sum(b['results_checked'] for b in benchmarks)} results, {bad} wrong elements")


if __name__ == "__main__":
    main()
