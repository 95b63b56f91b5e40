#!/usr/bin/env python3
"""Summarises comm-bench correctness logs (every element of every result checked) into a
bench/results JSON: per log and backend label, how many results were checked and how many
elements were wrong, with the ops, dtypes and sizes covered.

    python3 bench/tools/comm_checks.py OUT.json --commit C --machine M --notes N NAME=LOG ... \
        [--timeout-logs LOG ...] [--mismatch-logs LOG ...]
"""
import argparse
import json
import datetime


def timeouts(path):
    """[(label, ok, seconds, timeout)] from comm-bench --timeout-check lines."""
    out = []
    for line in open(path):
        if line.startswith("# timeout check ("):
            label = line.split("(", 1)[1].split(")", 1)[0]
            ok = "): ok after " in line
            secs = float(line.split(" after ", 1)[1].split(" s", 1)[0])
            limit = float(line.split("(timeout ", 1)[1].split(" s)", 1)[0])
            out.append((label, ok, secs, limit))
    return out


def mismatches(path):
    """[(mode, rank, ok, message)] from comm-bench --mismatch-check lines."""
    out = []
    for line in open(path):
        if line.startswith("# mismatch check "):
            head, _, msg = line.partition("): ")
            mode = int(head.split()[3])
            rank = int(head.split("(rank ")[1])
            out.append((mode, rank, msg.startswith("ok:"), msg.split(": ", 1)[-1].strip()))
    return out


def parse_rows(path):
    """[(backend label, fields of a result row)] from a comm-bench log."""
    rows, label = [], None
    for line in open(path):
        if line.startswith("# backend "):
            label = line.split()[2].rstrip(",")
            continue
        f = line.split()
        if label and len(f) >= 8 and f[0] in ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce"):
            rows.append((label, f))
    return rows


def parse(path):
    """{backend label: [(op, dtype, bytes, wrong)]} from a comm-bench log."""
    runs = {}
    for label, f in parse_rows(path):
        runs.setdefault(label, []).append((f[0], f[1], int(f[2]), int(f[7])))
    return runs


def write_results(path, a, benchmarks):
    """Writes the results file (shared/notes/bench-results.md's format) with `a`'s commit,
    machine and notes."""
    doc = {
        "date": datetime.date.today().isoformat(),
        "commit": a.commit,
        "machine": a.machine,
        "notes": a.notes,
        "benchmarks": benchmarks,
    }
    json.dump(doc, open(path, "w"), indent=2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("logs", nargs="+", help="NAME=LOG")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--notes", default="")
    ap.add_argument("--timeout-logs", nargs="*", help="logs with comm-bench --timeout-check lines")
    ap.add_argument("--mismatch-logs", nargs="*", help="logs with comm-bench --mismatch-check lines")
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
    for spec in a.timeout_logs or []:
        for label, ok, secs, limit in timeouts(spec):
            benchmarks.append({
                "name": f"timeout_{label}",
                "unit": "s",
                "oxtrain": secs,
                "timeout_s": limit,
                "ok": ok,
                "what": "rank 1 skips an all_reduce; rank 0's kernel gives up after the timeout and the call fails "
                        "naming rank 1; the next call fails at once",
            })
    what = {
        1: "the ranks pass different symmetric tensors to one all_reduce: each must fail with a mismatch "
           "error and no symmetric tensor may change",
        2: "rank 0 passes a symmetric tensor, rank 1 an ordinary one: rank 0 must fail with a mismatch error, "
           "rank 1 with an error, and no symmetric tensor may change",
    }
    for spec in a.mismatch_logs or []:
        for mode, rank, ok, msg in mismatches(spec):
            benchmarks.append({
                "name": f"mismatch{mode}_rank{rank}",
                "unit": "ok",
                "oxtrain": int(ok),
                "ok": ok,
                "error": msg,
                "what": what.get(mode, ""),
            })
    write_results(a.out, a, benchmarks)
    checks = [b for b in benchmarks if "results_checked" in b]
    bad = sum(b["oxtrain"] for b in checks)
    results = sum(b["results_checked"] for b in checks)
    timed = [b for b in benchmarks if "ok" in b]
    print(f"{len(checks)} runs, {results} results, {bad} wrong elements; "
          f"{sum(b['ok'] for b in timed)} of {len(timed)} timeout and mismatch checks ok")


if __name__ == "__main__":
    main()
