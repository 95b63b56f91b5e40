"""How fast nvJPEG decodes the ImageNet-like folder through torchvision (a reference for
oxtrain's GPU decoder): `python3 bench/peers/gpu_decode_probe.py ROOT [--batch 256 --batches 20]`.
Prints one JSON line: images per second of `torchvision.io.decode_jpeg(list, device="cuda")`,
and of the CPU reading of the files alone."""
import argparse, json, os, time

import torch
import torchvision
from torchvision.io import decode_jpeg

p = argparse.ArgumentParser()
p.add_argument("root")
p.add_argument("--batch", type=int, default=256)
p.add_argument("--batches", type=int, default=20)
a = p.parse_args()
files = []
for d, _, names in sorted(os.walk(os.path.join(a.root, "train"))):
    files += [os.path.join(d, n) for n in sorted(names)]
files = files[: a.batch * a.batches]
t = time.perf_counter()
data = [torchvision.io.read_file(f) for f in files]
read_s = time.perf_counter() - t
batches = [data[i : i + a.batch] for i in range(0, len(data), a.batch)]
decode_jpeg(batches[0], device="cuda")
torch.cuda.synchronize()
t = time.perf_counter()
for b in batches:
    decode_jpeg(b, device="cuda")
torch.cuda.synchronize()
gpu_s = time.perf_counter() - t
print(json.dumps({"images": len(files), "torchvision_gpu_decode_img_s": round(len(files) / gpu_s),
                  "read_img_s": round(len(files) / read_s), "torch": torch.__version__}))
