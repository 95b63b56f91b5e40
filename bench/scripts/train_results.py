"""Assembles train_h200.sh's raw JSON lines into one bench/results file (stdout).

For each case tag it reads <tag>.oxtrain.jsonl, <tag>.eager.jsonl and <tag>.compile.jsonl in
the given folder, keeps the best (highest-throughput) round of each side, and sets ours beside
the peer the results note names: torch.compile for bf16, eager for tf32.
"""

import datetime
import json
import os
import subprocess
import sys


def best(path):
    try:
        rows = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    except FileNotFoundError:
        return None, 0
    key = "oxtrain" if rows and "oxtrain" in rows[0] else "peer"
    return (max(rows, key=lambda r: r[key]) if rows else None), len(rows)


def main():
    out = sys.argv[1]
    cases = {"resnet50_bf16_b256": "compile", "gpt2_124m_bf16_b16_t1024": "compile", "resnet50_tf32_b256": "eager"}
    benchmarks, notes = [], []
    torch_version = None
    for tag, peer_kind in cases.items():
        ours, n_ours = best(os.path.join(out, f"{tag}.oxtrain.jsonl"))
        peers = {k: best(os.path.join(out, f"{tag}.{k}.jsonl")) for k in ("eager", "compile")}
        peer, n_peer = peers[peer_kind]
        if peer is None and peer_kind == "compile":
            peer, n_peer, peer_kind = *peers["eager"], "eager"
            notes.append(f"{tag}: torch.compile did not run, eager is the peer")
        entry = {"name": f"train_{tag}", "unit": (ours or peer or {}).get("unit", "")}
        if ours:
            entry["oxtrain"] = round(ours["oxtrain"], 1)
            entry["oxtrain_step_seconds"] = round(ours["step_seconds"], 5)
            entry["oxtrain_peak_memory_gib"] = round((ours.get("peak_memory_bytes") or 0) / 2**30, 2)
        else:
            notes.append(f"{tag}: oxtrain did not run (see {tag}.oxtrain.err)")
        if peer:
            torch_version = peer.get("torch_version", torch_version)
            entry["peer"] = round(peer["peer"], 1)
            entry["peer_name"] = f"torch {peer.get('torch_version')} {'torch.compile' if peer_kind == 'compile' else 'eager'}"
            entry["peer_step_seconds"] = round(peer["step_seconds"], 5)
            entry["peer_peak_memory_gib"] = round(peer["peak_memory_bytes"] / 2**30, 2)
        eager = peers["eager"][0]
        if eager and peer_kind != "eager":
            entry["eager_peer"] = round(eager["peer"], 1)
            if ours:
                entry["ratio_vs_eager"] = round(ours["oxtrain"] / eager["peer"], 3)
        if ours and peer:
            entry["ratio"] = round(ours["oxtrain"] / peer["peer"], 3)
        base, n_base = best(os.path.join(out, f"{tag}.base.jsonl"))
        if base:
            # An earlier oxtrain binary run beside this one (BASE_BIN): what the change bought.
            entry["oxtrain_before"] = round(base["oxtrain"], 1)
            entry["before_commit"] = os.environ.get("BASE_COMMIT", "")
        # The goals: 1.05x torch.compile for bf16, 1.0x eager for TF32.
        entry["goal"] = 1.0 if peer_kind == "eager" else 1.05
        entry["rounds"] = {"oxtrain": n_ours, "peer": n_peer}
        benchmarks.append(entry)
    # The GPU machine gets a copy of the tree whose git history may not be this commit's.
    commit = os.environ.get("COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            pass
    print(json.dumps({
        "date": datetime.date.today().isoformat(),
        "commit": commit,
        "machine": "nvidia-h200 (1x H200)",
        "notes": "Whole training step (zero_grad, forward, loss, backward, optimizer step) on synthetic "
                 "data already on the GPU: `oxtrain bench` against bench/peers/train.py "
                 f"(torch {torch_version}), interleaved case by case, median of 10 steps after 3 warm-up, "
                 "best round kept. ResNet-50 channels_last, SGD momentum; GPT-2 124M written plainly "
                 "(SDPA, fused AdamW, tied head). " + " ".join(notes),
        "benchmarks": benchmarks,
    }, indent=2))


if __name__ == "__main__":
    main()
