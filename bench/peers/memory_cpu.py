"""PyTorch peer of `memory_cpu` (bench/src/bin/memory_cpu): one measurement per process.

Usage: python3 bench/peers/memory_cpu.py activation LAYERS WIDTH HEADS BATCH SEQ MODE STEPS
MODE: baseline (the model and a gradient for every parameter, written, no step), none (STEPS
forward+backward steps) or blocks (the same with activation checkpointing per block:
transformers' activation_checkpointing_enable (gradient_checkpointing_enable before
version 5) with use_reentrant=False, i.e.
torch.utils.checkpoint(..., use_reentrant=False) around each GPT2Block).

The model is transformers' GPT2LMHeadModel in training mode (vocabulary 50257, 1024 positions,
HF's default dropout 0.1 everywhere, tied embeddings), on random token ids with labels = ids
(HF's shifted causal-LM loss). One thread (torch.set_num_threads(1)). Prints one JSON line:
peak_rss_kb (getrusage ru_maxrss of this process, the figure the Rust side reports the same
way) and step_seconds (the median of the steps after the first; absent for baseline).
"""

import json
import resource
import statistics
import sys
import time

import torch
import transformers


def main():
    section, layers, width, heads, batch, seq, mode, steps = sys.argv[1:9]
    assert section == "activation", f"unknown section {section}"
    layers, width, heads, batch, seq, steps = map(int, (layers, width, heads, batch, seq, steps))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=width, n_layer=layers, n_head=heads
    )
    model = transformers.GPT2LMHeadModel(config)
    model.train()
    ids = torch.randint(0, 50257, (batch, seq), generator=torch.Generator().manual_seed(1))
    out = {"mode": mode}
    if mode == "baseline":
        for p in model.parameters():
            # A copy, not zeros: untouched zero pages would not count in the RSS.
            p.grad = p.detach().clone()
    else:
        if mode == "blocks":
            # transformers 5 renamed gradient_checkpointing_enable; both wrap each block in
            # torch.utils.checkpoint.checkpoint with these kwargs.
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            model.zero_grad(set_to_none=True)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            times.append(time.perf_counter() - start)
        out["step_seconds"] = statistics.median(times[1:]) if len(times) > 1 else times[0]
    out["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(out))


if __name__ == "__main__":
    main()
