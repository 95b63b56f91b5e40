"""The whole ImageNet job in PyTorch, peer of `oxtrain train` in bench/scripts/imagenet_job.sh.

Usage:
  python3 bench/peers/imagenet_job.py make ROOT [--classes 100 --per-class 120 --val-per-class 10
                                                --width 500 --height 375 --quality 90]
      writes ROOT/train/<class>/*.JPEG and ROOT/val/<class>/*.JPEG (textured pictures, PIL,
      4:2:0 subsampling as PIL's default) unless ROOT/train already holds them; prints one JSON line.
  python3 bench/peers/imagenet_job.py train ROOT [--workers 16 --epochs 3 --batch 256 --image 224
                                                 --window 2 --device cuda|cpu --steps 0]
      torchvision's ImageFolder with the reference train transform (RandomResizedCrop,
      RandomHorizontalFlip, ToTensor, Normalize), a DataLoader with `workers` processes, pinned
      memory and persistent workers, ResNet-50 channels_last under bf16 autocast, SGD; prints
      one JSON line with images per second per epoch (wall time of the epoch's steps, the
      last one ended by a synchronisation) and per window of `window` steps. No evaluation.
Needs numpy, torch, torchvision and Pillow.
"""

import argparse
import json
import os
import statistics
import time


def make_class(job):
    """Writes class `c`'s pictures (its own random stream, so the folder is the same whatever
    the number of processes); returns (files, bytes)."""
    import numpy as np
    from PIL import Image

    args, c = job
    rng = np.random.default_rng(c)
    h, w = args.height, args.width
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    count, total = 0, 0
    for split, n in (("train", args.per_class), ("val", args.val_per_class)):
        d = os.path.join(args.root, split, f"n{c:08d}")
        os.makedirs(d, exist_ok=True)
        for i in range(n):
            # Smooth colour fields, an edge and fine texture, as photographs have.
            f = rng.uniform(5, 40, size=6)
            base = np.stack([
                128 + 90 * np.sin(x / f[0] + y / f[1]),
                128 + 80 * np.cos(y / f[2] - x / f[3]),
                128 + 70 * np.sin((x + y) / f[4]) * np.cos(x / f[5]),
            ], axis=-1)
            cx, cy, r = rng.uniform(0, w), rng.uniform(0, h), rng.uniform(h / 10, h / 2.5)
            base[(x - cx) ** 2 + (y - cy) ** 2 < r * r] += rng.uniform(-80, 80, size=3)
            img = np.clip(base + rng.normal(0, 11.5, size=(h, w, 3)), 0, 255).astype(np.uint8)
            path = os.path.join(d, f"img_{i:05d}.JPEG")
            Image.fromarray(img).save(path, quality=args.quality)
            count += 1
            total += os.path.getsize(path)
    return count, total


def make(args):
    from multiprocessing import Pool

    train = os.path.join(args.root, "train")
    if os.path.isdir(train) and len(os.listdir(train)) == args.classes:
        print(json.dumps({"root": args.root, "made": False}))
        return
    with Pool(os.cpu_count()) as pool:
        done = pool.map(make_class, [(args, c) for c in range(args.classes)])
    count, total = sum(d[0] for d in done), sum(d[1] for d in done)
    print(json.dumps({"root": args.root, "made": True, "files": count, "mean_bytes": total / max(count, 1)}))


def train(args):
    import torch
    import torch.nn.functional as F
    import torchvision
    from torchvision import transforms

    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.backends.cudnn.benchmark = True
    tf = transforms.Compose([
        transforms.RandomResizedCrop(args.image),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = torchvision.datasets.ImageFolder(os.path.join(args.root, "train"), tf)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=args.batch, shuffle=True, num_workers=args.workers, pin_memory=cuda,
        drop_last=True, persistent_workers=args.workers > 0,
        prefetch_factor=2 if args.workers > 0 else None)
    model = torchvision.models.resnet50(num_classes=len(ds.classes)).to(device, memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    epochs, windows = [], []
    for epoch in range(args.epochs):
        sync()
        start = window_start = time.perf_counter()
        images = window_images = steps = 0
        for x, y in loader:
            x = x.to(device, non_blocking=True).contiguous(memory_format=torch.channels_last)
            y = y.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            steps += 1
            images += x.shape[0]
            window_images += x.shape[0]
            if steps % args.window == 0:
                loss.item()  # a host read per window, as oxtrain's log line
                now = time.perf_counter()
                windows.append({"epoch": epoch + 1, "step": steps, "rate": window_images / (now - window_start)})
                window_start, window_images = now, 0
            if args.steps and steps >= args.steps:
                break
        sync()
        epochs.append({"epoch": epoch + 1, "images": images, "seconds": time.perf_counter() - start})
    for e in epochs:
        e["rate"] = e["images"] / e["seconds"]
    later = [e["rate"] for e in epochs[1:]] or [epochs[0]["rate"]]
    print(json.dumps({
        "name": f"pytorch_dataloader_{args.workers}w",
        "workers": args.workers,
        "batch": args.batch,
        "torch": torch.__version__,
        "epochs": epochs,
        "windows": windows,
        "img_per_s_after_first_epoch": sum(e["images"] for e in epochs[1:]) / sum(e["seconds"] for e in epochs[1:])
        if len(epochs) > 1 else epochs[0]["rate"],
        "median_epoch_rate": statistics.median(later),
    }))


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("root")
    m.add_argument("--classes", type=int, default=100)
    m.add_argument("--per-class", type=int, default=120)
    m.add_argument("--val-per-class", type=int, default=10)
    m.add_argument("--width", type=int, default=500)
    m.add_argument("--height", type=int, default=375)
    m.add_argument("--quality", type=int, default=90)
    t = sub.add_parser("train")
    t.add_argument("root")
    t.add_argument("--workers", type=int, default=16)
    t.add_argument("--epochs", type=int, default=3)
    t.add_argument("--batch", type=int, default=256)
    t.add_argument("--image", type=int, default=224)
    t.add_argument("--window", type=int, default=2)
    t.add_argument("--steps", type=int, default=0, help="at most this many steps per epoch (0: all)")
    t.add_argument("--device", default="cuda")
    args = p.parse_args()
    make(args) if args.cmd == "make" else train(args)


if __name__ == "__main__":
    main()
