//! Reference quantizers for the float and legacy 32-element types.
//!
//! These follow ggml's `quantize_row_*_ref` and are bit-exact with gguf-py's
//! `gguf.quants.quantize` (checked by `tests/gguf_py_vectors.rs`): f32
//! arithmetic in the same order, `trunc(v + 0.5)`-style rounding where ggml
//! casts to an integer, and round-half-away-from-zero (`roundf`) for Q8_0.

use crate::block::*;

/// Encodes whole blocks: `src` holds `dst.len() / B` blocks of `E` values.
/// Callers have checked the lengths.
pub(crate) fn blocks<const E: usize, const B: usize>(
    src: &[f32],
    dst: &mut [u8],
    encode: fn(&[f32; E]) -> [u8; B],
) {
    for (x, b) in src.chunks_exact(E).zip(dst.chunks_exact_mut(B)) {
        b.copy_from_slice(&encode(
            x.try_into().expect("chunks_exact yields E elements"),
        ));
    }
}

pub(crate) fn f32s(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.iter().zip(dst.chunks_exact_mut(4)) {
        b.copy_from_slice(&x.to_le_bytes());
    }
}

pub(crate) fn f16s(src: &[f32], dst: &mut [u8]) {
    for (&x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_f16(x));
    }
}

pub(crate) fn bf16s(src: &[f32], dst: &mut [u8]) {
    for (&x, b) in src.iter().zip(dst.chunks_exact_mut(2)) {
        b.copy_from_slice(&f32_to_bf16(x));
    }
}

/// The element of largest magnitude, keeping its sign; the first one wins
/// ties, as in ggml's `if (amax < fabsf(v))` scan and numpy's `argmax`.
pub(crate) fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// (min, max) of a block, for the offset types Q4_1 / Q5_1.
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// ggml's `MIN(hi, (int8_t)v)` for a non-negative `v`: truncation toward
/// zero. `as u8` saturates, so NaN or negative garbage gives 0, not UB.
fn trunc_clamp(v: f32, hi: u8) -> u8 {
    (v as u8).min(hi)
}

/// Packs 32 five-bit values into Q5's `qh` (bit j = bit 4 of value j) and
/// `qs` (element j low nibble, element j+16 high nibble).
fn pack_q5(q: &[u8; QK32]) -> ([u8; 4], [u8; 16]) {
    let mut qh = 0u32;
    let mut qs = [0u8; 16];
    for j in 0..16 {
        qs[j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
        qh |= u32::from(q[j] >> 4) << j;
        qh |= u32::from(q[j + 16] >> 4) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

pub(crate) fn q4_0(x: &[f32; QK32]) -> [u8; BlockQ4_0::BYTES] {
    let d = signed_absmax(x) / -8.0;
    let id = inverse_or_zero(d);
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let lo = trunc_clamp(x[j] * id + 8.5, 15);
        let hi = trunc_clamp(x[j + 16] * id + 8.5, 15);
        qs[j] = lo | (hi << 4);
    }
    BlockQ4_0 {
        d: f32_to_f16(d),
        qs,
    }
    .to_bytes()
}

pub(crate) fn q4_1(x: &[f32; QK32]) -> [u8; BlockQ4_1::BYTES] {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse_or_zero(d);
    let mut qs = [0u8; 16];
    for j in 0..16 {
        let lo = trunc_clamp((x[j] - min) * id + 0.5, 15);
        let hi = trunc_clamp((x[j + 16] - min) * id + 0.5, 15);
        qs[j] = lo | (hi << 4);
    }
    BlockQ4_1 {
        d: f32_to_f16(d),
        m: f32_to_f16(min),
        qs,
    }
    .to_bytes()
}

pub(crate) fn q5_0(x: &[f32; QK32]) -> [u8; BlockQ5_0::BYTES] {
    let d = signed_absmax(x) / -16.0;
    let id = inverse_or_zero(d);
    let q: [u8; QK32] = std::array::from_fn(|j| trunc_clamp(x[j] * id + 16.5, 31));
    let (qh, qs) = pack_q5(&q);
    BlockQ5_0 {
        d: f32_to_f16(d),
        qh,
        qs,
    }
    .to_bytes()
}

pub(crate) fn q5_1(x: &[f32; QK32]) -> [u8; BlockQ5_1::BYTES] {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse_or_zero(d);
    let q: [u8; QK32] = std::array::from_fn(|j| trunc_clamp((x[j] - min) * id + 0.5, 31));
    let (qh, qs) = pack_q5(&q);
    BlockQ5_1 {
        d: f32_to_f16(d),
        m: f32_to_f16(min),
        qh,
        qs,
    }
    .to_bytes()
}

pub(crate) fn q8_0(x: &[f32; QK32]) -> [u8; BlockQ8_0::BYTES] {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse_or_zero(d);
    // f32::round is roundf: halves go away from zero.
    let qs = std::array::from_fn(|j| (x[j] * id).round() as i8 as u8);
    BlockQ8_0 {
        d: f32_to_f16(d),
        qs,
    }
    .to_bytes()
}
