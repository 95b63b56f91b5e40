"""Writes the seed inputs of the fuzz targets into fuzz/corpus/<target>/.

Run once before the first fuzzing (python from PATH, with Pillow for the images):
    python fuzz/make_seeds.py
The fuzzer grows the corpora from these; `cargo +nightly fuzz cmin <target>` keeps them small.
"""

import io
import json
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent
REPO = ROOT.parent


def put(target, name, data):
    d = ROOT / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


def safetensors(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def seeds_safetensors():
    t = "safetensors"
    put(t, "f32", safetensors({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8))
    put(t, "empty", safetensors({}))
    put(t, "metadata", safetensors({"__metadata__": {"format": "pt"},
                                    "b": {"dtype": "BOOL", "shape": [3], "data_offsets": [0, 3]}}, b"\1\0\2"))
    dtypes = [("F64", 8), ("F16", 2), ("BF16", 2), ("I64", 8), ("U32", 4), ("U8", 1)]
    header, off = {}, 0
    for i, (dt, size) in enumerate(dtypes):
        header[f"t{i}"] = {"dtype": dt, "shape": [2, 1], "data_offsets": [off, off + 2 * size]}
        off += 2 * size
    put(t, "every_dtype", safetensors(header, bytes(range(off))))
    put(t, "scalar", safetensors({"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}, b"\0\0\x80\x3f"))
    put(t, "zero_dim", safetensors({"z": {"dtype": "F32", "shape": [0, 5], "data_offsets": [0, 0]}}))
    put(t, "overlap", safetensors({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                                   "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12))
    put(t, "unknown_dtype", safetensors({"q": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, b"\0" * 4))
    put(t, "huge", safetensors({"w": {"dtype": "F32", "shape": [25000000000],
                                      "data_offsets": [0, 100000000000]}}, b"\0" * 16))
    put(t, "twice", b'\x40\0\0\0\0\0\0\0{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8"}}\0')
    put(t, "short", b"\1\0\0")


def seeds_config():
    t = "config"
    for f in sorted((REPO / "examples" / "configs").glob("*.toml")):
        put(t, f.stem, "\n" + f.read_text())
    put(t, "empty", "\n")
    put(t, "overrides", "optim.lr=0.05 train.epochs=3 data.batch_size=8\n[model]\nname = \"resnet18\"\n")
    put(t, "unknown_key", "\n[train]\nepoch = 3\n")
    put(t, "wrong_type", "\n[optim]\nlr = \"fast\"\n")
    put(t, "impossible", "\n[data]\nbatch_size = 0\n[optim]\nlr = -1.0\n")
    put(t, "unknown_section", "\n[trian]\nsteps = 1\n")
    put(t, "nonfinite", "train.on_nonfinite=skip\n[train]\nmax_skipped = 3\n")


def manifest(**over):
    m = {"format": "oxtrain-checkpoint", "version": 1, "step": 2, "epoch": 0, "rank": 0, "world_size": 2,
         "files": [{"name": "model.safetensors", "bytes": 120, "xxh3": "00112233445566ff"}]}
    m.update(over)
    return json.dumps(m, indent=2)


def seeds_manifest():
    t = "checkpoint_manifest"
    put(t, "valid", manifest())
    put(t, "no_files", manifest(files=[]))
    put(t, "escape", manifest(files=[{"name": "../../etc/passwd", "bytes": 1, "xxh3": "0"}]))
    put(t, "rank_outside", manifest(rank=3))
    put(t, "version", manifest(version=7))
    put(t, "truncated", manifest()[:40])


def seeds_image():
    from PIL import Image

    t = "image"
    img = Image.new("RGB", (48, 36))
    for x in range(48):
        for y in range(36):
            img.putpixel((x, y), (x * 5, y * 7, (x * y) % 256))
    for fmt, mode, name in [("PNG", "RGB", "rgb.png"), ("PNG", "L", "gray.png"), ("PNG", "RGBA", "rgba.png"),
                            ("PNG", "P", "palette.png"), ("JPEG", "RGB", "rgb.jpg"), ("JPEG", "L", "gray.jpg"),
                            ("JPEG", "CMYK", "cmyk.jpg")]:
        buf = io.BytesIO()
        img.convert(mode).save(buf, fmt, quality=80)
        put(t, name, buf.getvalue())
        if name in ("rgb.png", "rgb.jpg"):
            put(t, "truncated_" + name, buf.getvalue()[: len(buf.getvalue()) // 2])
    buf = io.BytesIO()
    img.save(buf, "JPEG", progressive=True)
    put(t, "progressive.jpg", buf.getvalue())
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, "PNG")
    png = bytearray(buf.getvalue())
    png[16:24] = struct.pack(">II", 100000, 100000)  # IHDR width and height: a decompression bomb
    put(t, "bomb.png", bytes(png))
    put(t, "empty", b"")
    put(t, "text", b"not an image at all\n")


def request(op, key, value, timeout_ms=0):
    return bytes([op]) + struct.pack("<I", len(key)) + key + struct.pack("<I", len(value)) + value + \
        struct.pack("<Q", timeout_ms)


def seeds_store():
    t = "store_messages"
    put(t, "set_get", request(1, b"k", b"value") + request(2, b"k", b""))
    put(t, "add", request(3, b"n", struct.pack("<q", 5)) + request(3, b"n", struct.pack("<q", -7)))
    put(t, "check_delete_num", request(4, b"k", b"") + request(1, b"k", b"1") + request(5, b"k", b"") +
        request(6, b"", b""))
    put(t, "get_missing", request(2, b"never", b"", 10))
    put(t, "barrier", request(3, b"oxtrain/barrier/0/count", struct.pack("<q", 1)) +
        request(1, b"oxtrain/barrier/0/rank/0", b"1"))


if __name__ == "__main__":
    seeds_safetensors()
    seeds_config()
    seeds_manifest()
    seeds_image()
    seeds_store()
