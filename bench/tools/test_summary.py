"""Summarises a libtest log from the GPU machine into bench/results/<name>.json.

    python3 bench/tools/test_summary.py LOG OUT.json --commit abc1234 --machine "nvidia-h200 (1x H200)"

Counts every test by op family (the path under `ops::`, or the top module) and by device
(`::cuda` variants and `cuda::tests` count as CUDA), and lists each failure with the first line
of its panic message, so a reader sees what passes on the GPU and what does not yet.
"""

import argparse
import collections
import datetime
import json
import re


def family(name):
    parts = name.split("::")
    return parts[1] if parts[0] == "ops" and len(parts) > 1 else parts[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("out")
    ap.add_argument("--commit", required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--notes", default="")
    a = ap.parse_args()
    text = open(a.log, encoding="utf-8", errors="replace").read()
    results = re.findall(r"^test (\S+)(?: - should panic)? \.\.\. (ok|FAILED|ignored)$", text, re.M)
    messages = {}
    for m in re.finditer(r"^---- (\S+) stdout ----\n\n?thread '[^']*' \(\d+\) panicked at ([^\n]*):\n([^\n]*)", text, re.M):
        messages[m.group(1)] = f"{m.group(3)} ({m.group(2)})"
    counts = collections.defaultdict(lambda: collections.Counter())
    failures = []
    for name, status in results:
        device = "cuda" if name.endswith("::cuda") or name.startswith("cuda::") or "cuda_" in name else "cpu"
        counts[f"{family(name)} ({device})"][status] += 1
        if status == "FAILED":
            failures.append({"test": name, "message": messages.get(name, "")})
    summary = {
        "date": datetime.date.today().isoformat(),
        "commit": a.commit,
        "machine": a.machine,
        "notes": a.notes,
        "passed": sum(c["ok"] for c in counts.values()),
        "failed": len(failures),
        "by_family": {k: dict(v) for k, v in sorted(counts.items())},
        "failures": failures,
    }
    with open(a.out, "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    print(f"{summary['passed']} passed, {summary['failed']} failed -> {a.out}")


if __name__ == "__main__":
    main()
