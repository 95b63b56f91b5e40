"""Fixtures for the transform tests: torchvision's functional ops on a small PNG, and the crop
parameters torchvision's RandomResizedCrop draws (with the random numbers it drew, so the Rust
sampler can replay them).

Run from anywhere: python3 datasets/src/transforms/fixtures.py
Needs numpy, torch, torchvision and Pillow (`pip install torchvision`). Writes test_image.png and
fixtures.json beside this script.
"""

import math
import os
import sys

import numpy as np
import torch
import torchvision
import torchvision.transforms.functional as F
from PIL import Image
from torchvision.transforms import InterpolationMode, RandomResizedCrop

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "scripts", "fixtures"))
import fixture_io  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def test_image():
    """A 123x91 RGB image with smooth gradients, sharp edges and noise, so resampling differences show."""
    h, w = 91, 123
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rng = np.random.default_rng(7)
    r = 127 + 120 * np.sin(x / 9.0) * np.cos(y / 13.0)
    g = np.where((x - 60) ** 2 + (y - 40) ** 2 < 25**2, 230.0, 30.0) + 0.5 * x
    b = (x * 2 + y * 3) % 256
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 12, size=(h, w, 3))
    return Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8), "RGB")


def hwc(pil):
    return fixture_io.tensor(np.asarray(pil, dtype=np.uint8))


class Recorder:
    """Stands in for the `torch` module inside torchvision's transforms and records every draw."""

    def __init__(self):
        self.uniforms, self.randints = [], []

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty(self, *args, **kwargs):
        rec = self

        class Draw:
            def __init__(self):
                self.t = torch.empty(*args, **kwargs)

            def uniform_(self, a, b):
                self.t.uniform_(a, b)
                rec.uniforms.append(self.t.item())
                return self.t

        return Draw()

    def randint(self, *args, **kwargs):
        v = torch.randint(*args, **kwargs)
        self.randints.append(v.item())
        return v


def photo_cases(cases):
    """A JPEG large enough for the loader's DCT-scaled decoding, decoded by PIL as torchvision does."""
    h, w = 360, 480
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    rng = np.random.default_rng(11)
    img = np.stack([128 + 100 * np.sin(x / 23.0 + y / 41.0), 128 + 90 * np.cos(y / 17.0), (x + 2 * y) % 256], axis=-1)
    img += rng.normal(0, 6, size=(h, w, 3))
    pil = Image.fromarray(np.clip(np.rint(img), 0, 255).astype(np.uint8), "RGB")
    pil.save(os.path.join(HERE, "test_photo.jpg"), quality=92)
    photo = Image.open(os.path.join(HERE, "test_photo.jpg")).convert("RGB")
    bilinear = InterpolationMode.BILINEAR
    for n, (box, out) in enumerate([((0, 0, 360, 480), (90, 120)), ((40, 60, 300, 320), (64, 64)), ((10, 10, 200, 200), (96, 96))]):
        res = F.resized_crop(photo, *box, list(out), interpolation=bilinear, antialias=True)
        cases[f"photo_crop_{n}"] = {"box": list(box), "out": list(out), "expected": hwc(res)}
    res = F.center_crop(F.resize(photo, 128, interpolation=bilinear, antialias=True), 112)
    cases["photo_eval"] = {"short": 128, "crop": 112, "expected": hwc(res)}


def rrc_cases(cases):
    import torchvision.transforms.transforms as T

    sizes = [(500, 375), (375, 500), (224, 224), (4000, 3000), (1000, 20), (20, 1000), (3, 1)]
    for k, (w, h) in enumerate(sizes):
        for seed in range(6):
            torch.manual_seed(1000 * k + seed)
            rec = Recorder()
            saved, T.torch = T.torch, rec
            try:
                i, j, ch, cw = RandomResizedCrop.get_params(
                    torch.empty(3, h, w), scale=[0.08, 1.0], ratio=[3 / 4, 4 / 3]
                )
            finally:
                T.torch = saved
            cases[f"rrc_{w}x{h}_{seed}"] = {
                "size": [w, h],
                "uniforms": fixture_io.tensor(np.array(rec.uniforms, dtype=np.float64)),
                "randints": rec.randints,
                "result": [i, j, ch, cw],
            }


def main():
    img = test_image()
    img.save(os.path.join(HERE, "test_image.png"))
    img = Image.open(os.path.join(HERE, "test_image.png")).convert("RGB")
    cases = {}
    bilinear = InterpolationMode.BILINEAR
    # (top, left, height, width) -> (out_h, out_w): downscaling by up to 4x, upscaling, unequal axes.
    crops = [
        ((0, 0, 91, 123), (24, 24)),
        ((10, 7, 60, 80), (32, 28)),
        ((33, 50, 21, 17), (40, 48)),
        ((5, 90, 80, 30), (30, 30)),
        ((40, 3, 45, 100), (45, 100)),
    ]
    for n, (box, out) in enumerate(crops):
        res = F.resized_crop(img, *box, list(out), interpolation=bilinear, antialias=True)
        cases[f"resized_crop_{n}"] = {"box": list(box), "out": list(out), "expected": hwc(res)}
        cases[f"resized_crop_{n}"]["flipped"] = hwc(F.hflip(res))
        if n == 1:
            t = F.normalize(F.to_tensor(res), MEAN, STD)
            cases[f"resized_crop_{n}"]["normalized_chw"] = fixture_io.tensor(t)
    for n, (short, crop) in enumerate([(64, 48), (50, 37), (91, 91), (120, 100)]):
        res = F.center_crop(F.resize(img, short, interpolation=bilinear, antialias=True), crop)
        cases[f"resize_center_{n}"] = {"short": short, "crop": crop, "expected": hwc(res)}
    photo_cases(cases)
    rrc_cases(cases)
    cases["versions"] = {"torchvision": torchvision.__version__.split("+")[0], "torch": torch.__version__.split("+")[0]}
    fixture_io.write(__file__, cases)


if __name__ == "__main__":
    main()
