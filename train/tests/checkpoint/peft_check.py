"""Checks with PEFT itself what `oxtrain export --peft-adapter` and `--merge-lora` wrote for a
GPT-2 LoRA run: PEFT loads the adapter folder with every adapter key it expects (and no
other), and the merged file, loaded strictly into transformers' GPT2LMHeadModel, gives the
logits of PEFT's base + adapters.

    python3 train/tests/checkpoint/peft_check.py BASE_DIR ADAPTER_DIR MERGED.safetensors

Needs torch, transformers, peft, safetensors. Prints `ok` and exits 0, else says what differs.
"""

import sys

import torch
from peft import PeftModel, get_peft_model_state_dict
from safetensors.torch import load_file
from transformers import GPT2LMHeadModel


def main(base_dir, adapter_dir, merged_path):
    peft = PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(base_dir), adapter_dir)
    expected = set(get_peft_model_state_dict(peft).keys())
    ours = set(load_file(f"{adapter_dir}/adapter_model.safetensors").keys())
    if ours != expected:
        sys.exit(f"adapter keys differ: only ours {sorted(ours - expected)}, only PEFT's {sorted(expected - ours)}")
    peft.eval()
    merged = GPT2LMHeadModel.from_pretrained(base_dir)
    state = load_file(merged_path)
    state.setdefault("lm_head.weight", state["transformer.wte.weight"])
    merged.load_state_dict(state, strict=True)
    merged.eval()
    ids = torch.arange(24).reshape(2, 12) % peft.config.vocab_size
    with torch.no_grad():
        a, b = peft(input_ids=ids).logits, merged(input_ids=ids).logits
    worst = (a - b).abs().max().item()
    if worst > 1e-4 * a.abs().max().item():
        sys.exit(f"merged logits differ from PEFT's by {worst}")
    print("ok")


if __name__ == "__main__":
    main(*sys.argv[1:4])
