"""PyTorch's figures for bench/src/bin/cuda_ops.rs: same shapes, same timing method.

Prints one JSON object. Needs torch with CUDA. Times come from CUDA events around ITERS calls,
median of TRIALS trials after warm-up, as on the oxtrain side.
"""

import json
import statistics

import torch

TRIALS = 7
RESNET_CONVS = [(64, 64, 56, 3), (256, 64, 56, 1), (128, 128, 28, 3), (256, 256, 14, 3), (1024, 256, 14, 1), (512, 512, 7, 3)]
CONV_BATCH = 128


def time_gpu(iters, f):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    times = []
    for _ in range(TRIALS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            f()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / iters)
    return statistics.median(times)


def main():
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = "cuda"
    out = {"torch": f"torch {torch.__version__}"}
    mb256 = 64 << 20
    a, b = torch.rand(mb256, device=dev), torch.rand(mb256, device=dev)
    out["add_f32_256MB"] = 3 * (256 << 20) / time_gpu(20, lambda: torch.add(a, b)) / 1e9
    x = torch.rand(mb256 // 1024, 1024, device=dev)
    out["softmax_f32_256MB"] = 2 * (256 << 20) / time_gpu(20, lambda: torch.softmax(x, dim=-1)) / 1e9
    del a, b, x
    a = torch.rand(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.rand(8192, 8192, device=dev, dtype=torch.bfloat16)
    out["matmul_bf16_8192"] = 2 * 8192**3 / time_gpu(10, lambda: torch.matmul(a, b)) / 1e12
    del a, b
    layers = []
    flops = 0
    for cin, cout, hw, k in RESNET_CONVS:
        xx = torch.rand(CONV_BATCH, cin, hw, hw, device=dev, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        w = torch.rand(cout, cin, k, k, device=dev, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        layers.append((xx, w, k // 2))
        flops += 2 * CONV_BATCH * cout * hw * hw * cin * k * k
    torch.backends.cudnn.benchmark = False

    def convs():
        for xx, w, p in layers:
            torch.nn.functional.conv2d(xx, w, padding=p)

    out["conv2d_bf16_nhwc_resnet50"] = flops / time_gpu(5, convs) / 1e12
    print(json.dumps(out))


if __name__ == "__main__":
    main()
