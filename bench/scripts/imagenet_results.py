"""Assembles bench/results/imagenet-h200.json from one sitting of bench/scripts/imagenet_job.sh.

Usage: python3 bench/scripts/imagenet_results.py OUT_DIR RESULT_JSON

OUT_DIR holds what the sitting wrote: bare.json (the `oxtrain bench` line of the bare step),
oxtrain_<W>w_<decode>.meta.json (batch, workers, decoder, the run's metrics.jsonl path) and
pytorch_<W>w.json (the peer's line). For each oxtrain run, from metrics.jsonl:
- each epoch's images per second: its steps' images over the time from the record before its
  first step (the previous epoch's evaluation when there was one, so evaluation is excluded)
  to its last record; the job's figure is over every epoch after the first;
- each window's rate (the records' step and elapsed time, evaluation gaps left out) after the
  first epoch: its minimum against its median shows whether epochs still start with a stall.
Then the acceptance items of issue 33 with their thresholds.
"""

import glob
import json
import os
import statistics
import subprocess
import sys
import time


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip().startswith("{")]


def epochs_and_windows(recs, images_per_step):
    train = [r for r in recs if r.get("kind") == "train"]
    evals = [r for r in recs if r.get("kind") == "eval"]
    epochs = []
    for e in sorted({r["epoch"] for r in train}):
        mine = [r for r in train if r["epoch"] == e]
        first = min(r["elapsed"] for r in mine)
        before = [r for r in train + evals if r["elapsed"] < first]
        t0 = max((r["elapsed"] for r in before), default=0.0)
        s0 = max((r["step"] for r in train if r["elapsed"] < first), default=0)
        t1, s1 = max(r["elapsed"] for r in mine), max(r["step"] for r in mine)
        images = (s1 - s0) * images_per_step
        epochs.append({"epoch": e, "images": images, "seconds": t1 - t0, "rate": images / max(t1 - t0, 1e-9)})
    windows, prev = [], None
    for r in sorted(train, key=lambda r: r["elapsed"]):
        if prev is not None:
            # Time spent evaluating between two records is not the window's.
            start = max([prev["elapsed"]] + [v["elapsed"] for v in evals if prev["elapsed"] < v["elapsed"] < r["elapsed"]])
            windows.append({"epoch": r["epoch"], "step": r["step"], "rate": (r["step"] - prev["step"]) * images_per_step / max(r["elapsed"] - start, 1e-9), "logged": r.get("throughput")})
        prev = r
    return epochs, windows


def summary(epochs, windows):
    later = epochs[1:] or epochs
    rate = sum(e["images"] for e in later) / max(sum(e["seconds"] for e in later), 1e-9)
    after = [w["rate"] for w in windows if w["epoch"] > 1] or [w["rate"] for w in windows] or [0.0]
    median = statistics.median(after)
    return {
        "epochs": epochs,
        "img_per_s_after_first_epoch": rate,
        "min_window_rate_after_first_epoch": min(after),
        "median_window_rate_after_first_epoch": median,
        "min_over_median": min(after) / median if median else None,
        "windows": windows,
    }


def main(out, result):
    bare_line = json.load(open(os.path.join(out, "bare.json"))) if os.path.exists(os.path.join(out, "bare.json")) else None
    bare = bare_line["oxtrain"] if bare_line else None
    runs = {}
    for meta_path in sorted(glob.glob(os.path.join(out, "oxtrain_*.meta.json"))):
        meta = json.load(open(meta_path))
        tag = os.path.basename(meta_path)[: -len(".meta.json")]
        if not os.path.exists(meta["metrics"]):
            runs[tag] = {**meta, "failed": "no metrics.jsonl"}
            continue
        epochs, windows = epochs_and_windows(records(meta["metrics"]), meta["batch"] * meta.get("world_size", 1))
        s = summary(epochs, windows)
        s["ratio_to_bare_step"] = s["img_per_s_after_first_epoch"] / bare if bare else None
        if meta.get("decode") == "auto":
            # The run's own line says when auto picked the GPU.
            log = os.path.join(out, tag + ".log")
            said = os.path.exists(log) and "data.decode = auto: decoding JPEGs on the GPU" in open(log).read()
            s["auto_decoded_on"] = "gpu" if said else "cpu"
        runs[tag] = {**meta, **s}
    for p in sorted(glob.glob(os.path.join(out, "pytorch_*w.json"))):
        line = json.load(open(p))
        after = [w["rate"] for w in line["windows"] if w["epoch"] > 1]
        line["min_window_rate_after_first_epoch"] = min(after, default=None)
        line["median_window_rate_after_first_epoch"] = statistics.median(after) if after else None
        runs[os.path.basename(p)[:-5]] = line

    def job(tag, peer, need_bare, need_peer):
        ours, theirs = runs.get(tag, {}), runs.get(peer, {})
        value = ours.get("img_per_s_after_first_epoch")
        peer_value = theirs.get("img_per_s_after_first_epoch")
        item = {"oxtrain": value, "bare_step": bare, "pytorch": peer_value,
                "ratio_to_bare_step": value / bare if value and bare else None,
                "ratio_to_pytorch": value / peer_value if value and peer_value else None,
                "needs": {"ratio_to_bare_step": need_bare, "ratio_to_pytorch": need_peer}}
        ok = item["ratio_to_bare_step"] is not None and item["ratio_to_bare_step"] >= need_bare
        if need_peer is not None:
            ok = ok and item["ratio_to_pytorch"] is not None and item["ratio_to_pytorch"] >= need_peer
        item["pass"] = ok
        return item

    stalls = {t: r.get("min_over_median") for t, r in runs.items() if t.startswith("oxtrain_")}
    acceptance = {
        # What `oxtrain train` does by default (data.decode = "auto") on this 16-core machine.
        "imagenet_job_bf16_16w": job("oxtrain_16w_auto", "pytorch_16w", 0.95, 2.0),
        "imagenet_job_bf16_4w_gpu_decode": job("oxtrain_4w_gpu", "pytorch_4w", 0.9, None),
        "no_window_below_half_the_median": {"min_over_median": stalls,
                                            "pass": bool(stalls) and all(v is not None and v >= 0.5 for v in stalls.values())},
    }
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    doc = {
        "what": "issue 33: the ImageNet-like job (100 classes, 12000 JPEGs ~500x375 q90), ResNet-50 bf16 channels_last batch 256, oxtrain train vs PyTorch DataLoader, same sitting",
        "made_by": "bench/scripts/imagenet_job.sh + bench/scripts/imagenet_results.py",
        "commit": os.environ.get("COMMIT", commit or "unknown"),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": os.environ.get("DEVICE_NAME", ""),
        "bare_step": bare_line,
        "acceptance": acceptance,
        "runs": runs,
    }
    with open(result, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    for name, item in acceptance.items():
        print(f"{name}: {'pass' if item['pass'] else 'FAIL'} {json.dumps({k: v for k, v in item.items() if k != 'needs'})}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
