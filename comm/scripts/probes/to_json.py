"""The NVLink probes' logs as one bench/results file (format: bench-results.md).

Each pattern's figure is set against the copy engines' (`ce`, one large copy each way at once),
the fastest way measured to move bytes over the link: `ratio` is the share of that ceiling.
Usage: to_json.py nvlink_ceiling.log ce_allreduce.log [--commit C --machine M] > out.json
"""
import argparse
import datetime
import json
import re

ap = argparse.ArgumentParser()
ap.add_argument("ceiling_log")
ap.add_argument("ce_allreduce_log")
ap.add_argument("--commit", default="")
ap.add_argument("--machine", default="")
args = ap.parse_args()

rows = [json.loads(l) for l in open(args.ceiling_log) if l.startswith("{")]
ce = next(r["gbps_per_direction"] for r in rows if r["pattern"] == "ce")
bench = []
for r in rows:
    if r["pattern"] == "ce":
        continue
    tag = f"{r['blocks']}blocks" if "blocks" in r else f"{r['chunk_mb']}MB_chunks"
    if "ce_percent" in r:
        tag = f"{r['ce_percent']}pct_ce_{tag}"
    bench.append({
        "name": f"nvlink_{r['pattern'].replace('-', '_').replace('+', '_')}_{tag}",
        "unit": "GB/s per direction",
        "oxtrain": r["gbps_per_direction"],
        "peer": ce,
        "peer_name": "copy engines, 1 GiB cudaMemcpyAsync each way at once",
        "ratio": round(r["gbps_per_direction"] / ce, 3),
    })
pat = re.compile(r"S +(\d+) MB chunk +(\d+) MB G +(\d+): busbw ([\d.]+)")
for line in open(args.ce_allreduce_log):
    m = pat.search(line)
    if m:
        size, chunk, grid, bw = m.groups()
        bench.append({
            "name": f"ce_allreduce_{size}MB_{chunk}MB_chunks_{grid}blocks",
            "unit": "GB/s busbw",
            "oxtrain": float(bw),
            "peer": ce,
            "peer_name": "copy engines, 1 GiB cudaMemcpyAsync each way at once",
            "ratio": round(float(bw) / ce, 3),
        })
    if "WRONG" in line:
        raise SystemExit(f"ce_allreduce gave a wrong result: {line.strip()}")
print(json.dumps({
    "date": datetime.date.today().isoformat(),
    "commit": args.commit,
    "machine": args.machine,
    "notes": "NVLink probes (comm/scripts/probes), one process driving both GPUs, each sending to the other at once; "
             "1 GiB each way, median of 7 (ce_allreduce: 8). push/pull/mixed: SM kernels of 512 threads, 4 packs of "
             "16 B in flight per thread; mixed is the pattern of the one-pass symmetric kernel (half read from the peer, "
             "half written to it; with 64 blocks or more the symmetric all-reduce pushes). ce_flag: copies in chunks, each followed by a flag written into the peer "
             "(cuStreamWriteValue32). ce_push/ce_pull: a share of the bytes (pct_ce) by one copy to the peer and the "
             "rest at once by SM stores into the peer (push) or the peer's SM loads (pull), on two streams. ce_allreduce: a copy-engine all-reduce prototype (copies + flags + a small "
             "adding kernel). The ceiling for any all-reduce on 2 GPUs is the per-direction figure of the traffic "
             "it makes.",
    "benchmarks": bench,
}, indent=1))
