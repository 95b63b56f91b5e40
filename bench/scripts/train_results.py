"""Assembles bench/scripts/train_h200.sh's raw JSON lines into one bench/results file.

Usage: python3 bench/scripts/train_results.py DIR [--out FILE] [--table]

DIR holds <tag>.<side>.jsonl, one line per process, each tagged with its round: side oxtrain
(`oxtrain bench`), base (an earlier oxtrain, BASE_BIN), eager and compile (the strong PyTorch
peer), plain_eager and plain_compile (the older peer, once); cold_<model>.{oxtrain,eager}.jsonl
for the first step from cold. A row compares the rounds that both of its sides ran; each side's
figure is the median over those rounds of its per-process medians (one rule for both sides).
Writes the JSON to --out (else stdout); --table prints a short table to stdout.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

# tag -> the peer kind of the row (the issue's: torch.compile for bf16, eager for TF32)
SPEED_CASES = {"resnet50_bf16_b256": "compile", "gpt2_124m_bf16_b16_t1024": "compile", "resnet50_tf32_b256": "eager"}
COLD_CASES = ("resnet50", "gpt2")
SPEED_GOAL = 1.05
COLD_MARGIN_S = 3.0  # the acceptance: ours at most this much over the peer's first step
GIB = 2**30


def lines(path):
    """The JSON objects of a .jsonl file, by round (a line without one: its position)."""
    try:
        with open(path) as f:
            rows = [json.loads(l) for l in f if l.strip().startswith("{")]
    except FileNotFoundError:
        return {}
    return {r.get("round", i + 1): r for i, r in enumerate(rows)}


def median_of(rows, key):
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def peak_bytes(rows):
    """The largest peak over the rounds (memory is nearly the same each round; the larger is
    the cautious figure for both sides)."""
    peaks = [r["peak_memory_bytes"] for r in rows if r.get("peak_memory_bytes")]
    return max(peaks) if peaks else None


def rounded(x, digits=3):
    return round(x, digits) if x is not None else None


def gib(n):
    return round(n / GIB, 2) if n is not None else None


def side(rows, key):
    """A side's figures over the given rounds' lines (key: 'oxtrain' or 'peer')."""
    return {
        "value": median_of(rows, key),
        "step_seconds": median_of(rows, "step_seconds"),
        "peak_bytes": peak_bytes(rows),
        "per_round": [round(r[key], 1) for r in rows],
        "best": max(r[key] for r in rows),
    }


def paired(a, b):
    """The lines of a and of b from the rounds both ran, in round order."""
    common = sorted(set(a) & set(b))
    return [a[r] for r in common], [b[r] for r in common]


def describe(peer_line, kind):
    setup = peer_line.get("setup")
    if setup:
        return setup
    return f"torch {peer_line.get('torch_version')} {'torch.compile' if kind == 'compile' else 'eager'}"


def extra_peer(entry, prefix, ours_lines, peer_lines, kind):
    """Another peer beside the row's (eager beside compile, the plain peer): its median, its
    ratio against ours over the rounds both ran, its memory and what it was."""
    o, p = paired(ours_lines, peer_lines)
    if not p:
        # The plain peer runs once, outside the rounds: set it beside ours' median of all rounds.
        o, p = list(ours_lines.values()), list(peer_lines.values())
    if not p:
        return
    theirs = side(p, "peer")
    entry[f"{prefix}_peer"] = round(theirs["value"], 1)
    entry[f"{prefix}_peer_name"] = describe(p[0], kind)
    entry[f"{prefix}_peer_peak_memory_gib"] = gib(theirs["peak_bytes"])
    if o:
        entry[f"ratio_vs_{prefix}"] = round(side(o, "oxtrain")["value"] / theirs["value"], 3)


def speed_row(out, tag, kind, notes):
    ours_lines = lines(os.path.join(out, f"{tag}.oxtrain.jsonl"))
    peers = {k: lines(os.path.join(out, f"{tag}.{k}.jsonl"))
             for k in ("eager", "compile", "plain_eager", "plain_compile")}
    if not peers[kind] and kind == "compile" and peers["eager"]:
        kind = "eager"
        notes.append(f"{tag}: torch.compile did not run, eager is the peer")
    o, p = paired(ours_lines, peers[kind])
    any_line = next(iter((ours_lines or peers[kind] or {0: {}}).values()))
    entry = {"name": f"train_{tag}", "unit": any_line.get("unit", "")}
    if not p:
        notes.append(f"{tag}: no round with both oxtrain ({len(ours_lines)} runs) and the {kind} peer "
                     f"({len(peers[kind])} runs); see {tag}.*.err")
        return entry
    ours, theirs = side(o, "oxtrain"), side(p, "peer")
    entry.update({
        "oxtrain": round(ours["value"], 1),
        "peer": round(theirs["value"], 1),
        "peer_name": describe(p[0], kind),
        "ratio": round(ours["value"] / theirs["value"], 3),
        "goal": SPEED_GOAL,
        "rounds": len(p),
        "oxtrain_step_seconds": round(ours["step_seconds"], 5),
        "peer_step_seconds": round(theirs["step_seconds"], 5),
        "oxtrain_peak_memory_gib": gib(ours["peak_bytes"]),
        "peer_peak_memory_gib": gib(theirs["peak_bytes"]),
        "oxtrain_per_round": ours["per_round"],
        "peer_per_round": theirs["per_round"],
        "oxtrain_best": round(ours["best"], 1),
        "peer_best": round(theirs["best"], 1),
    })
    if ours["peak_bytes"] is not None and theirs["peak_bytes"] is not None:
        entry["memory_within"] = ours["peak_bytes"] <= theirs["peak_bytes"]
    if kind == "compile":
        extra_peer(entry, "eager", ours_lines, peers["eager"], "eager")
    for plain in ("plain_compile", "plain_eager"):
        extra_peer(entry, plain, ours_lines, peers[plain], plain)
    base = lines(os.path.join(out, f"{tag}.base.jsonl"))
    if base:
        # An earlier oxtrain binary run beside this one (BASE_BIN): what the change bought.
        _, b = paired(ours_lines, base)
        entry["oxtrain_before"] = round(side(b, "oxtrain")["value"], 1)
        entry["before_commit"] = os.environ.get("BASE_COMMIT", "")
    return entry


def cold_row(out, model, notes):
    ours = list(lines(os.path.join(out, f"cold_{model}.oxtrain.jsonl")).values())
    peer = list(lines(os.path.join(out, f"cold_{model}.eager.jsonl")).values())
    entry = {"name": f"first_step_cold_{model}", "unit": "s"}
    o, p = median_of(ours, "first_step_seconds"), median_of(peer, "first_step_seconds")
    if o is not None:
        entry["oxtrain"] = round(o, 3)
        entry["oxtrain_process_to_first_step_seconds"] = rounded(median_of(ours, "process_to_first_step_seconds"))
    elif ours:
        notes.append(f"first_step_cold_{model}: oxtrain bench printed no first_step_seconds")
    else:
        notes.append(f"first_step_cold_{model}: oxtrain's cold run failed (cold_{model}.oxtrain.err)")
    if p is not None:
        entry["peer"] = round(p, 3)
        entry["peer_name"] = (describe(peer[0], "eager") + "; the first step of a fresh process "
                              "(--warmup 1 --steps 3)")
        entry["peer_process_to_first_step_seconds"] = rounded(median_of(peer, "process_to_first_step_seconds"))
        # The acceptance is ours <= peer + 3 s; as a ratio peer/ours that is peer / (peer + 3).
        entry["goal"] = round(p / (p + COLD_MARGIN_S), 3)
    else:
        notes.append(f"first_step_cold_{model}: PyTorch's cold run failed (cold_{model}.eager.err)")
    if o is not None and p is not None:
        entry["ratio"] = round(p / o, 3)
        entry["within_3s"] = o <= p + COLD_MARGIN_S
    return entry


def commit_id():
    # The GPU machine gets a copy of the tree whose git history may not be this commit's.
    commit = os.environ.get("COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                    check=False, capture_output=True, text=True).stdout.strip()
        except OSError:
            pass
    return commit


def notes_text(benchmarks, extra):
    rounds = sorted({b["rounds"] for b in benchmarks if "rounds" in b})
    return (
        "Whole training step (zero_grad, forward, loss, backward, optimizer step) on synthetic data "
        "already on the GPU: `oxtrain bench` against bench/peers/train.py, the strong PyTorch peer "
        "(cudnn.benchmark, channels_last ResNet, bf16 autocast or TF32, fused optimizers; GPT-2 "
        "with the vocabulary padded to 50304 and the loss over the 50257 real columns, the last "
        "position's target ignored, as oxtrain's loss; with torch.compile, one compiled function "
        "from the batch to the loss). Equal rounds interleaved case by case (ours, torch eager, "
        f"torch.compile), {'/'.join(map(str, rounds)) or 'no'} rounds per row; every process "
        "reports the median of its timed steps after warm-up, and each side's figure is the median "
        "over the rounds both sides ran of those medians (the same rule for both; *_best and "
        "*_per_round beside). ratio = oxtrain/peer throughput for the train_ rows; the "
        "first_step_cold_ rows are seconds, ratio = peer/oxtrain, ours with an empty kernel cache "
        "(OXTRAIN_KERNEL_CACHE a new folder) against PyTorch eager's first step in a fresh process, "
        "goal = peer/(peer + 3 s). Peak memory: the largest over the rounds, CUDA caching "
        "allocator's peak allocation on both sides. " + " ".join(extra)
    ).strip()


def table(result):
    rows = [f"{'benchmark':36} {'oxtrain':>10} {'peer':>10} {'ratio':>6} {'goal':>5}  memory GiB (ours/peer)"]
    for b in result["benchmarks"]:
        mem = ""
        if b.get("oxtrain_peak_memory_gib") is not None:
            mem = f"{b['oxtrain_peak_memory_gib']}/{b.get('peer_peak_memory_gib')}"
        rows.append(f"{b['name']:36} {b.get('oxtrain', '-'):>10} {b.get('peer', '-'):>10} "
                    f"{b.get('ratio', '-'):>6} {b.get('goal', '-'):>5}  {mem}")
        if "eager_peer" in b:
            rows.append(f"{'  vs torch eager':36} {'':>10} {b['eager_peer']:>10} {b.get('ratio_vs_eager', '-'):>6}")
    return "\n".join(rows)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--out")
    p.add_argument("--table", action="store_true")
    a = p.parse_args()
    notes, benchmarks = [], []
    for tag, kind in SPEED_CASES.items():
        benchmarks.append(speed_row(a.dir, tag, kind, notes))
    for model in COLD_CASES:
        benchmarks.append(cold_row(a.dir, model, notes))
    result = {
        "date": datetime.date.today().isoformat(),
        "commit": commit_id(),
        "machine": "nvidia-h200 (1x H200)",
        "notes": notes_text(benchmarks, notes),
        "benchmarks": benchmarks,
    }
    text = json.dumps(result, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if a.table:
        print(table(result), file=sys.stdout if a.out else sys.stderr)


if __name__ == "__main__":
    main()
