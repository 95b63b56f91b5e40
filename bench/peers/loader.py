"""Peer for bench/src/bin/loader.rs: torchvision's ImageFolder + DataLoader (PIL) with
RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize, one core.

Usage:
  python3 bench/peers/loader.py write DIR N   writes N textured 500x375 JPEGs (quality 90, PIL's
                                              default 4:2:0 subsampling, about 77 KB each) into
                                              DIR/<class>/, prints {"files", "mean_bytes"}
  python3 bench/peers/loader.py run DIR REPS  prints one JSON object of timings
Needs numpy, torch, torchvision and Pillow.
"""

import json
import os
import statistics
import sys
import time


def write(root, n):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    h, w = 375, 500
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    sizes = []
    for i in range(n):
        cls = os.path.join(root, f"class_{i % 10:02d}")
        os.makedirs(cls, exist_ok=True)
        # Smooth colour fields, some edges and fine texture, as photographs have.
        f = rng.uniform(5, 40, size=6)
        base = np.stack([
            128 + 90 * np.sin(x / f[0] + y / f[1]),
            128 + 80 * np.cos(y / f[2] - x / f[3]),
            128 + 70 * np.sin((x + y) / f[4]) * np.cos(x / f[5]),
        ], axis=-1)
        cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(40, 150)
        base[(x - cx) ** 2 + (y - cy) ** 2 < r * r] += rng.uniform(-80, 80, size=3)
        img = base + rng.normal(0, 11.5, size=(h, w, 3))
        path = os.path.join(cls, f"img_{i:05d}.JPEG")
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8), "RGB").save(path, quality=90)
        sizes.append(os.path.getsize(path))
    print(json.dumps({"files": n, "mean_bytes": sum(sizes) / len(sizes)}))


def run(root, reps):
    import PIL
    import torch
    import torchvision
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    torch.set_num_threads(1)
    tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(root, tf)
    n = len(ds)

    # Wall clock with one worker process (kept alive, so its start-up is not timed).
    loader = DataLoader(ds, batch_size=32, shuffle=True, num_workers=1, persistent_workers=True, prefetch_factor=4)
    wall = []
    for rep in range(reps + 1):
        t0 = time.perf_counter()
        for _ in loader:
            pass
        if rep > 0:
            wall.append(time.perf_counter() - t0)
    del loader

    # CPU time of the loading itself, on the calling thread (num_workers=0).
    loader0 = DataLoader(ds, batch_size=32, shuffle=True, num_workers=0)
    cpu = []
    for rep in range(reps + 1):
        t0 = time.process_time()
        for _ in loader0:
            pass
        if rep > 0:
            cpu.append(time.process_time() - t0)
    print(json.dumps({
        "images": n,
        "img_per_s": n / statistics.median(wall),
        "cpu_img_per_s": n / statistics.median(cpu),
        "torch_version": torch.__version__.split("+")[0],
        "torchvision_version": torchvision.__version__.split("+")[0],
        "pillow_version": PIL.__version__,
    }))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]))
    else:
        run(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 5)
