"""Runs `oxtrain bench` and its PyTorch peer (bench/peers/train.py) interleaved, at 1 and 2
threads, and writes bench/results/train-cpu.json (the format of the project's notes on
benchmark results). Run from the repository root after `cargo build --release -p oxtrain`.

Usage: python3 bench/tools/train_cpu.py [--steps S] [--warmup W] [--rounds R] [--threads 1,2]
       [--models resnet50,gpt2] [--out PATH]
Environment: OXTRAIN_BIN (default target/release/oxtrain), OXTRAIN_PEER_PYTHON (default the
interpreter running this script).

Per case, the rounds run oxtrain then torch, R times; each side's figure is the best of its
round medians (a burst of load from other processes then hits at most one of them).
"""

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys

CASES = [
    # (result name, model, extra arguments)
    ("train_resnet50_cpu_b8_128_{t}t", "resnet50", ["--batch", "8", "--image", "128"]),
    ("train_gpt2_small_cpu_{t}t", "gpt2", ["--batch", "8", "--seq", "128"]),
]


def run_json(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def uptime():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--models", default="resnet50,gpt2", help="which cases to run (an A/B of one model: gpt2)")
    p.add_argument("--out", default="bench/results/train-cpu.json")
    args = p.parse_args()
    oxtrain = os.environ.get("OXTRAIN_BIN", "target/release/oxtrain")
    python = os.environ.get("OXTRAIN_PEER_PYTHON", sys.executable)
    steps = ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    load_before = uptime()
    benchmarks, torch_version = [], "?"
    models = args.models.split(",")
    unknown = sorted(set(models) - {model for _, model, _ in CASES})
    if unknown:
        p.error(f"unknown model(s) {unknown}; the cases are {[model for _, model, _ in CASES]}")
    for t in [int(x) for x in args.threads.split(",")]:
        for name, model, extra in [c for c in CASES if c[1] in models]:
            ox, pe = [], []
            for _ in range(args.rounds):
                env = dict(os.environ, RAYON_NUM_THREADS=str(t))
                ox.append(run_json([oxtrain, "bench", model, "--device", "cpu", "--threads", str(t), *extra, *steps], env))
                penv = dict(os.environ, OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t))
                # --plain: the CPU rows keep the peer they were measured against (eager, torch defaults).
                pe.append(run_json([python, "bench/peers/train.py", model, "--plain", "--threads", str(t), *extra, *steps],
                                   penv))
                print(f"{name.format(t=t)}: oxtrain {ox[-1]['step_seconds']:.3f} s, torch {pe[-1]['step_seconds']:.3f} s",
                      file=sys.stderr)
            o = min(ox, key=lambda r: r["step_seconds"])
            q = min(pe, key=lambda r: r["step_seconds"])
            torch_version = q["torch_version"]
            benchmarks.append({
                "name": name.format(t=t),
                "unit": o["unit"],
                "oxtrain": round(o["oxtrain"], 3),
                "peer": round(q["peer"], 3),
                "peer_name": f"torch {torch_version} eager, {t} threads",
                "ratio": round(q["step_seconds"] / o["step_seconds"], 3),
                "goal": 1.0,
                "oxtrain_step_seconds": round(o["step_seconds"], 4),
                "peer_step_seconds": round(q["step_seconds"], 4),
                "oxtrain_peak_rss_mb": round((o["peak_memory_bytes"] or 0) / 2**20, 1),
                "peer_peak_rss_mb": round(q["peak_memory_bytes"] / 2**20, 1),
            })
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    flags = open("/proc/cpuinfo").read()
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "commit": commit or "unknown",
        "machine": f"cpu: {os.cpu_count()}-core {cpu} ({'AVX-512' if 'avx512f' in flags else 'no AVX-512'}), {platform.system()}",
        "notes": (
            f"Whole training step (zero_grad, forward, loss, backward, optimizer step) on a fixed synthetic batch; "
            f"oxtrain `oxtrain bench` vs bench/peers/train.py (torch {torch_version}, eager), same threads, interleaved "
            f"(oxtrain then torch, {args.rounds} round(s) per case); median of {args.steps} steps after {args.warmup} "
            f"warm-up; best round kept. ResNet-50: batch 8, 128x128, SGD momentum 0.9. GPT-2: 4 layers, 256 wide, "
            f"4 heads, vocab 50257, T 128, batch 8, AdamW; torch uses causal SDPA. ratio = torch step time / oxtrain "
            f"step time. Peak memory is each process's peak RSS (MB). Load average (1, 5, 15 min) before: "
            f"{load_before}; after: {uptime()}."
        ),
        "benchmarks": benchmarks,
    }
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
