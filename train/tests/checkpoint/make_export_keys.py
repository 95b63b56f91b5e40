"""The state_dict names, shapes and dtypes that PyTorch expects of an exported checkpoint.

Run from anywhere (needs torch, torchvision, transformers; builds every model from its config,
downloads nothing):
    python3 train/tests/checkpoint/make_export_keys.py

Writes export_keys.json beside this script, read by train/tests/checkpoint_export_keys.rs, which
exports oxtrain's models as `oxtrain export` does and compares the file with it key by key, so CI
checks the names PyTorch loads without needing Python. Per model:
  config   the sizes it was built with (the Rust test builds the same)
  tensors  [name, dtype, shape] of every entry of `model.state_dict()`, in its order, buffers
           such as `num_batches_tracked` (int64, shape []) included
  tied     name -> the name it shares storage with. Hugging Face's `save_pretrained` leaves the
           tied name out of the file and `from_pretrained` ties it again, so an export may omit
           it; when present it must still have the right shape and dtype.
"""

import json
import os

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

GPT2 = dict(vocab_size=97, n_positions=32, n_embd=64, n_layer=2, n_head=4)
BERT = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=32, type_vocab_size=2, num_labels=3)


def entry(model, config):
    tensors = [[name, str(t.dtype).replace("torch.", ""), list(t.shape)] for name, t in model.state_dict().items()]
    tied = dict(getattr(model, "_tied_weights_keys", None) or {})
    return {"config": config, "tensors": tensors, "tied": tied}


def readable_json(models):
    """JSON with one tensor a line, so that a regenerated fixture diffs by name."""
    one = lambda x: json.dumps(x, sort_keys=True)
    blocks = []
    for name in sorted(models):
        m = models[name]
        if "tensors" not in m:
            blocks.append(f" {one(name)}: {one(m)}")
            continue
        rows = ",\n".join(f"   {one(t)}" for t in m["tensors"])
        blocks.append(f" {one(name)}: {{\n  \"config\": {one(m['config'])},\n  \"tied\": {one(m['tied'])},\n"
                      f"  \"tensors\": [\n{rows}\n  ]\n }}")
    return "{\n" + ",\n".join(blocks) + "\n}\n"


def main():
    import torchvision
    import transformers

    torch.manual_seed(0)
    models = {}
    for arch in ["resnet18", "resnet50"]:
        models[arch] = entry(getattr(torchvision.models, arch)(), {"num_classes": 1000})
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    models["gpt2"] = entry(gpt2, GPT2)
    bert = transformers.BertForSequenceClassification(transformers.BertConfig(**BERT))
    models["bert"] = entry(bert, BERT)
    models["versions"] = {"torch": torch.__version__.split("+")[0], "torchvision": torchvision.__version__.split("+")[0],
                          "transformers": transformers.__version__}
    path = os.path.join(HERE, "export_keys.json")
    with open(path, "w") as f:
        f.write(readable_json(models))
    for name, m in models.items():
        if name != "versions":
            print(f"{name}: {len(m['tensors'])} tensors, tied {m['tied']}")
    print("wrote", path)


if __name__ == "__main__":
    main()
