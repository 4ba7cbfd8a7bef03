#!/usr/bin/env python3
"""A plain reader of libmoe checkpoints, written against the published formats only (safetensors:
8-byte little-endian header size, JSON header, raw little-endian tensors; libmoe's metadata as
docs/checkpoints.md describes it), with the standard library and NumPy: nothing of libmoe is used.

    read_checkpoint.py DIR [NAME]          prints every global tensor's name, dtype and shape
    read_checkpoint.py DIR NAME --check-g  also checks every parameter against g() below, the values
                                           tests/mpi/test_checkpoint_ep.c gives them

Reassembles each global tensor from the pieces of every rank's file (a piece is a box of the tensor's
view; data-parallel replicas may hold the same box twice) and checks each piece's CRC-32 and that the
pieces cover the tensor. Exit status 0 when everything holds.
"""
import json
import struct
import sys
import zlib

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "BF16": np.uint16}


def g(slot, i):
    """tests/mpi/test_checkpoint_ep.c's g(): parameter values from the element's global position
    (uint64 arithmetic wraps modulo 2^64, as in C)."""
    with np.errstate(over="ignore"):
        z = np.asarray(i, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = z + np.uint64((slot * 0xBF58476D1CE4E5B9) % (1 << 64))
        z ^= z >> np.uint64(29)
        z = z * np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(32)
    return ((z % np.uint64(2001)).astype(np.int64) - 1000).astype(np.float32) / np.float32(1024.0)


def read_file(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__")
    assert meta["libmoe.format"] == "libmoe-checkpoint-1", path
    data = raw[8 + n :]
    pieces = []
    for name, t in header.items():
        b, e = t["data_offsets"]
        desc = json.loads(meta["libmoe.tensor." + name])
        buf = data[b:e]
        assert zlib.crc32(buf) == int(desc["crc32"], 16), f"{path}: {name}: CRC-32 mismatch"
        arr = np.frombuffer(buf, dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        if t["dtype"] == "BF16":  # widen: bf16 is the top half of an fp32
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        pieces.append((name, desc, arr, int(meta["libmoe.rank"])))
    return pieces


def main():
    d = sys.argv[1]
    name = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("--") else "moe"
    check = "--check-g" in sys.argv
    with open(f"{d}/{name}.index.json") as f:
        index = json.load(f)
    pieces = [p for fe in index["files"] for p in read_file(f"{d}/{fe['file']}")]
    tensors = {}
    for pname, desc, arr, rank in pieces:
        if desc["kind"] == 2:  # per-rank accumulators: one per rank, not one global tensor
            tensors[f"{pname}@rank{rank}"] = (desc, arr.copy(), None)
            continue
        view = desc["view"]
        if pname not in tensors:
            tensors[pname] = (desc, np.zeros(view, dtype=arr.dtype), np.zeros(view, dtype=np.int32))
        _, full, hits = tensors[pname]
        box = tuple(slice(o, o + n) for o, n in zip(desc["offset"], arr.shape))
        if hits[box].max() == 0 or not np.array_equal(full[box], arr):
            assert hits[box].max() == 0, f"{pname}: two pieces overlap with different values"
        full[box] = arr
        hits[box] = 1
    bad = 0
    for tname, (desc, full, hits) in sorted(tensors.items()):
        if hits is not None:
            assert hits.min() == 1, f"{tname}: the pieces do not cover the tensor"
            full = full.reshape(desc["shape"])
        print(f"{tname}: {full.dtype} {list(full.shape)}")
        if check and desc["kind"] == 0:
            want = g(desc["slot"], np.arange(full.size)).reshape(full.shape)
            if not np.array_equal(full.astype(np.float32), want):
                print(f"  differs from g() in {int((full != want).sum())} elements")
                bad += 1
    print(f"numpy reader: {len(tensors)} tensors from {len(index['files'])} files, {bad} wrong")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
