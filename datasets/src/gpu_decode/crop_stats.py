"""Makes crop_stats.json: the statistics of torchvision's RandomResizedCrop(224) crops of a
500x375 image (scale (0.08, 1), ratio (3/4, 4/3)), from get_params itself, for the test that
the GPU path's crop sampler draws the same distribution.

Run: python3 datasets/src/gpu_decode/crop_stats.py  (torch, torchvision; writes beside itself)
"""

import json
import math
import os

import torch
import torchvision
from torchvision.transforms import RandomResizedCrop

torch.manual_seed(0)
img = torch.zeros(3, 375, 500)
n = 200_000
scales, logs = [], []
for _ in range(n):
    i, j, h, w = RandomResizedCrop.get_params(img, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    scales.append(w * h / (500 * 375))
    logs.append(math.log(w / h))


def moments(v):
    m = sum(v) / len(v)
    return m, math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


(sm, ss), (lm, ls) = moments(scales), moments(logs)
out = {
    "torchvision": torchvision.__version__,
    "samples": n,
    "scale_mean": sm, "scale_std": ss,
    "log_ratio_mean": lm, "log_ratio_std": ls,
    # Deciles of the area fraction, for a comparison of the whole distribution.
    "scale_deciles": [sorted(scales)[n * k // 10] for k in range(1, 10)],
}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "crop_stats.json"), "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print(out)
