"""Writes the host translation unit of the attention_v2 kernels: common.cuh with its two inline-PTX
f16 conversions replaced by C++ ones, then attention_v2.cu and attention_v2_backward.cu (their own
PTX stays out under OXTRAIN_EMULATED_PTX, which emu.h defines).

Usage: python3 host_source.py TENSOR_SRC_DIR OUT_FILE
"""

import re
import sys


def main():
    src, out = sys.argv[1], sys.argv[2]
    common = open(f"{src}/cuda/common.cuh").read()
    common = re.sub(
        r"__device__ __forceinline__ float f16_to_f32\(f16_t x\) \{.*?\n\}\n",
        "inline float f16_to_f32(f16_t x) { _Float16 h; memcpy(&h, &x, 2); return (float)h; }\n",
        common,
        flags=re.S,
    )
    common = re.sub(
        r"__device__ __forceinline__ f16_t f32_to_f16\(float f\) \{.*?\n\}\n",
        "inline f16_t f32_to_f16(float f) { _Float16 h = (_Float16)f; f16_t x; memcpy(&x, &h, 2); return x; }\n",
        common,
        flags=re.S,
    )
    assert "asm" not in common, "common.cuh has inline PTX this script does not replace"
    parts = [common] + [open(f"{src}/ops/attention/{f}").read() for f in ("attention_v2.cu", "attention_v2_backward.cu")]
    open(out, "w").write("\n".join(parts))


if __name__ == "__main__":
    main()
