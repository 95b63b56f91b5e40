"""Writes accuracy_fixtures.json: how far PyTorch's f32 training drifts from its own f64 run,
the yardstick of tests/accuracy.rs (oxtrain may drift at most twice as far).

Both sides run the very same case: the weights, images and labels are not drawn from either
framework's random generator but computed by `det_uniform` below (splitmix64 of a counter,
keyed by the seed and the tensor's name), which accuracy.rs computes bit for bit the same.
The drift of f32 from f64 varies a thousandfold from one random initialisation to another
(with torch's own initialisation one seed stays within 1e-6 for ten steps, another departs at
step 2 and reaches 2e-3: rare ReLU sign flips set it), so a bar measured on another draw would
say nothing about oxtrain's kernels.

- resnet18_sgd: torchvision ResNet-18 (1000 classes), batch 2 of 64x64 images, the same batch
  every step, cross-entropy, SGD lr 0.01 momentum 0.9, 10 steps in f32 and in f64 from the
  same f64 initial weights; after each step the relative L2 distance of all parameters
  (concatenated) of the f32 run from the f64 run.
- resnet50_conv1_grad: torchvision ResNet-50, batch 2 of 64x64, cross-entropy, one backward
  in f32 and in f64 from the same weights; the relative L2 distance of conv1.weight's gradient.

Weights: convolutions uniform with torchvision's variance (kaiming normal, fan_out, ReLU gain:
bound sqrt(6 / fan_out)), batch norms weight 1 and bias 0, fc weight and bias uniform in
+-1/sqrt(in_features); images uniform with unit variance; labels in 0..1000.
Run: python3 bench/tests/accuracy_fixtures.py (torch, torchvision and numpy).
"""

import copy
import json
import math
import os

import numpy as np
import torch
import torch.nn.functional as F
import torchvision

torch.set_num_threads(max(1, os.cpu_count() or 1))

RESNET18_SEED = 0
RESNET50_SEED = 0
BATCH = (2, 3, 64, 64)
MASK = (1 << 64) - 1


def fnv1a64(text):
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & MASK
    return h


def splitmix64(key, n):
    """The i-th value (i = 1..n) of splitmix64 started at `key`, as uint64."""
    with np.errstate(over="ignore"):
        z = np.uint64(key) + np.arange(1, n + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def det_uniform(seed, name, n, bound):
    """n values uniform in [-bound, bound), exactly as accuracy.rs's `det_uniform`."""
    u = (splitmix64(fnv1a64(f"{seed}:{name}"), n) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return (2.0 * u - 1.0) * bound


def det_init(model, seed):
    for name, p in model.named_parameters():
        if p.dim() == 4:
            fan_out = p.shape[0] * p.shape[2] * p.shape[3]
            values = det_uniform(seed, name, p.numel(), math.sqrt(6.0 / fan_out))
        elif name.startswith("fc."):
            values = det_uniform(seed, name, p.numel(), 1.0 / math.sqrt(model.fc.in_features))
        elif name.endswith("weight"):
            values = np.ones(p.numel())
        else:
            values = np.zeros(p.numel())
        with torch.no_grad():
            p.copy_(torch.from_numpy(values).reshape(p.shape))


def det_batch(seed):
    n = math.prod(BATCH)
    x = torch.from_numpy(det_uniform(seed, "images", n, math.sqrt(3.0))).reshape(BATCH)
    y = torch.from_numpy((splitmix64(fnv1a64(f"{seed}:labels"), BATCH[0]) % np.uint64(1000)).astype(np.int64))
    return x, y


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def flat(model):
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def pair(arch, seed):
    m64 = arch(num_classes=1000).double()
    det_init(m64, seed)
    return copy.deepcopy(m64).float(), m64


def resnet18_drift(seed):
    m32, m64 = pair(torchvision.models.resnet18, seed)
    x, y = det_batch(seed)
    opts = [torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9) for m in (m32, m64)]
    out = []
    for _ in range(10):
        for m, o, xx in ((m32, opts[0], x.float()), (m64, opts[1], x)):
            o.zero_grad()
            F.cross_entropy(m(xx), y).backward()
            o.step()
        out.append(rel(flat(m32), flat(m64)))
    return out


def conv1_grad_drift(seed):
    m32, m64 = pair(torchvision.models.resnet50, seed)
    x, y = det_batch(seed)
    for m, xx in ((m32, x.float()), (m64, x)):
        F.cross_entropy(m(xx), y).backward()
    return rel(m32.conv1.weight.grad.double(), m64.conv1.weight.grad)


def main():
    per_step = resnet18_drift(RESNET18_SEED)
    conv1 = conv1_grad_drift(RESNET50_SEED)
    here = os.path.dirname(os.path.abspath(__file__))
    x, y = det_batch(RESNET18_SEED)
    with open(os.path.join(here, "accuracy_fixtures.json"), "w") as f:
        json.dump({
            "torch_version": torch.__version__.split("+")[0],
            # accuracy.rs checks that it generates the same case.
            "resnet18_first_pixels": x.flatten()[:4].tolist(),
            "resnet18_labels": y.tolist(),
            "resnet18_conv1_weight_sum": det_uniform(RESNET18_SEED, "conv1.weight", 64 * 3 * 49,
                                                     math.sqrt(6.0 / (64 * 49))).sum(),
            "resnet18_seed": RESNET18_SEED,
            "resnet18_sgd_relative_distance_per_step": per_step,
            "resnet50_seed": RESNET50_SEED,
            "resnet50_conv1_grad_relative_distance": conv1,
        }, f, indent=2)
        f.write("\n")
    print(per_step, conv1)


if __name__ == "__main__":
    main()
