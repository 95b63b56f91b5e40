"""Writes accuracy_fixtures.json: how far PyTorch's f32 training drifts from its own f64 run,
the yardstick of tests/accuracy.rs (oxtrain may drift at most twice as far).

- resnet18_sgd: torchvision ResNet-18 (1000 classes), batch 2 of 64x64 images, the same batch
  every step, cross-entropy, SGD lr 0.01 momentum 0.9, 10 steps in f32 and in f64 from the
  same f64 initial weights; after each step the relative L2 distance of all parameters
  (concatenated) of the f32 run from the f64 run.
- resnet50_conv1_grad: torchvision ResNet-50, batch 2 of 64x64, cross-entropy, one backward
  in f32 and in f64 from the same weights; the relative L2 distance of conv1.weight's gradient.

Each figure is the median over three seeds, so one lucky or unlucky initialisation does not
set the bar. Run: python3 bench/tests/accuracy_fixtures.py (torch and torchvision).
"""

import copy
import json
import os
import statistics

import torch
import torch.nn.functional as F
import torchvision

torch.set_num_threads(max(1, os.cpu_count() or 1))


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def flat(model):
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


def resnet18_drift(seed):
    torch.manual_seed(seed)
    m64 = torchvision.models.resnet18(num_classes=1000).double()
    m32 = copy.deepcopy(m64).float()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    y = torch.randint(0, 1000, (2,))
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
    torch.manual_seed(seed)
    m64 = torchvision.models.resnet50(num_classes=1000).double()
    m32 = copy.deepcopy(m64).float()
    x = torch.randn(2, 3, 64, 64, dtype=torch.float64)
    y = torch.randint(0, 1000, (2,))
    for m, xx in ((m32, x.float()), (m64, x)):
        F.cross_entropy(m(xx), y).backward()
    return rel(m32.conv1.weight.grad.double(), m64.conv1.weight.grad)


def main():
    seeds = [0, 1, 2]
    drifts = [resnet18_drift(s) for s in seeds]
    per_step = [statistics.median(d[i] for d in drifts) for i in range(10)]
    conv1 = statistics.median(conv1_grad_drift(s) for s in seeds)
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "accuracy_fixtures.json"), "w") as f:
        json.dump({
            "torch_version": torch.__version__.split("+")[0],
            "resnet18_sgd_relative_distance_per_step": per_step,
            "resnet50_conv1_grad_relative_distance": conv1,
        }, f, indent=2)
        f.write("\n")
    print(per_step, conv1)


if __name__ == "__main__":
    main()
