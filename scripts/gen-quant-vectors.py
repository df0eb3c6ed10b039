#!/usr/bin/env python3
"""Generate kiln-quant's reference vectors with gguf-py (`pip install gguf numpy`).

Writes crates/kiln-quant/tests/data/gguf_py_vectors.bin, read by
crates/kiln-quant/tests/gguf_py_vectors.rs. Deterministic (fixed seed), so
re-running with the same gguf-py and numpy gives the same file.

Format, all little-endian:
    b"KQV1", u32 record count, then per record:
    u32 kind (0 = dequantize, 1 = quantize), u32 ggml type id,
    u32 n_elems, u32 n_bytes, n_bytes packed bytes, n_elems f32 values.
For kind 0 the bytes are the input and the f32 values gguf-py's output; for
kind 1 the f32 values are the input and the bytes gguf-py's output.

Usage: python3 scripts/gen-quant-vectors.py [output path]
"""

import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

OUT = Path(__file__).resolve().parent.parent / "crates/kiln-quant/tests/data/gguf_py_vectors.bin"

# Byte offsets of the f16 scale fields in each block (ggml-common.h). Random
# payload bytes are fine everywhere else, but a random f16 scale may be
# NaN/Inf, which makes bit comparison meaningless.
F16_SCALE_OFFSETS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}

# Enough blocks to hit every nibble, bit plane and scale slot, few enough to
# keep the file small.
N_BLOCKS_32 = 16
N_BLOCKS_256 = 4
N_FLOATS = 512


def sane_f16(rng: np.random.Generator, n: int) -> np.ndarray:
    """Finite f16 scales of mixed sign and magnitude, a few subnormal or zero."""
    mag = np.exp2(rng.uniform(-16.0, 2.0, size=n)).astype(np.float16)
    sign = np.where(rng.random(n) < 0.3, -1.0, 1.0).astype(np.float16)
    out = mag * sign
    out[rng.random(n) < 0.05] = 0
    return out


def random_non_nan_bits(rng: np.random.Generator, n: int, bits: int) -> np.ndarray:
    """Random IEEE bit patterns (subnormals and +-inf included), NaN -> signed zero."""
    dt, fdt, sign = (np.uint16, np.float16, 0x8000) if bits == 16 else (np.uint32, np.float32, 0x80000000)
    v = rng.integers(0, 1 << bits, size=n, dtype=np.uint64).astype(dt)
    v[np.isnan(v.view(fdt))] &= dt(sign)
    return v


def dequant_record(rng: np.random.Generator, ty: T) -> tuple[int, int, bytes, np.ndarray]:
    if ty == T.F32:
        raw = random_non_nan_bits(rng, N_FLOATS, 32).view(np.uint8)
    elif ty in (T.F16, T.BF16):
        v = random_non_nan_bits(rng, N_FLOATS, 16)
        if ty == T.BF16:
            # bf16 NaN is an f32 NaN: exponent 0xff with a non-zero mantissa.
            nan = ((v & 0x7F80) == 0x7F80) & ((v & 0x7F) != 0)
            v[nan] &= np.uint16(0x8000)
        raw = v.view(np.uint8)
    else:
        block_elems, block_bytes = GGML_QUANT_SIZES[ty]
        n_blocks = N_BLOCKS_32 if block_elems == 32 else N_BLOCKS_256
        blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for off in F16_SCALE_OFFSETS[ty]:
            blocks[:, off : off + 2] = sane_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
        raw = blocks.reshape(-1)
    out = quants.dequantize(raw, ty).astype(np.float32, copy=False).reshape(-1)
    return 0, int(ty), raw.tobytes(), out


def quant_inputs(rng: np.random.Generator, n_blocks: int) -> np.ndarray:
    """Gaussian blocks of varied scale plus edge cases ggml handles specially."""
    x = rng.standard_normal((n_blocks, 32)).astype(np.float32)
    x *= np.exp2(rng.uniform(-8.0, 4.0, size=(n_blocks, 1))).astype(np.float32)
    x[0] = 0.0  # all-zero block: d = 0, id = 0
    x[1] = np.arange(32, dtype=np.float32) - 16.0  # exact ties after scaling
    x[2] = -np.abs(x[2])  # largest magnitude negative
    x[3, 5] = x[3, 9] = 7.25  # repeated maximum: first index wins
    x[3, 20] = -7.25
    return x.reshape(-1)


def quant_record(rng: np.random.Generator, ty: T) -> tuple[int, int, bytes, np.ndarray]:
    x = quant_inputs(rng, N_BLOCKS_32)
    if ty == T.BF16:
        # Also exercise rounding ties and the NaN quieting path.
        x[:4] = np.array([0x3F808000, 0x3F818000, 0x7F800001, 0xFF800000], dtype=np.uint32).view(np.float32)
    packed = quants.quantize(x, ty)
    return 1, int(ty), np.ascontiguousarray(packed).view(np.uint8).tobytes(), x


def main() -> None:
    out_path = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    rng = np.random.default_rng(0x6B696C6E)  # "kiln"
    records = []
    for ty in [T.F32, T.F16, T.BF16, *F16_SCALE_OFFSETS]:
        records.append(dequant_record(rng, ty))
    for ty in [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]:
        records.append(quant_record(rng, ty))

    buf = bytearray(b"KQV1")
    buf += struct.pack("<I", len(records))
    for kind, ty, raw, values in records:
        values = np.ascontiguousarray(values, dtype="<f4")
        buf += struct.pack("<IIII", kind, ty, values.size, len(raw))
        buf += raw
        buf += values.tobytes()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_bytes(bytes(buf))
    print(f"wrote {len(records)} records, {len(buf)} bytes to {out_path}")


if __name__ == "__main__":
    main()
