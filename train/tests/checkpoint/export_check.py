"""Loads models exported from oxtrain checkpoints into PyTorch and compares logits.

Usage: python export_check.py DIR
DIR holds what the Rust test `exported_models_load_in_pytorch` wrote:
  resnet/model.safetensors   torchvision resnet18 state_dict (exported from a checkpoint)
  resnet/io.safetensors      the input `x` and oxtrain's `logits`
  gpt2/model.safetensors + gpt2/config.json   a Hugging Face GPT2LMHeadModel folder
  gpt2/io.safetensors        `input_ids` and oxtrain's `logits`
Prints one line per model with the largest absolute difference; exits 1 if one is over its
tolerance. Runs on the CPU with no network.
"""

import sys

import torch
import torchvision
import transformers
from safetensors.torch import load_file

TOLERANCE = 2e-4


def check(name, ours, theirs):
    diff = (ours - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    ok = diff <= TOLERANCE * max(1.0, scale)
    print(f"{name}: logits {tuple(theirs.shape)}, max |oxtrain - torch| = {diff:.3e} "
          f"(max |logit| {scale:.3f}) {'ok' if ok else 'MISMATCH'}")
    return ok


def main(root):
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, "
          f"transformers {transformers.__version__}")
    results = []

    resnet = torchvision.models.resnet18()
    # strict: every name of the exported file is a torchvision name and nothing is missing.
    resnet.load_state_dict(load_file(f"{root}/resnet/model.safetensors"), strict=True)
    resnet.eval()
    io = load_file(f"{root}/resnet/io.safetensors")
    with torch.no_grad():
        results.append(check("resnet18", io["logits"], resnet(io["x"])))

    gpt2 = transformers.GPT2LMHeadModel.from_pretrained(f"{root}/gpt2", local_files_only=True)
    gpt2.eval()
    io = load_file(f"{root}/gpt2/io.safetensors")
    with torch.no_grad():
        results.append(check("gpt2", io["logits"], gpt2(io["input_ids"]).logits))

    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main(sys.argv[1])
