//! Scalar dequantizers: the spec every fast kernel is tested against.
//!
//! Each function decodes one block and follows ggml's `dequantize_row_*`
//! with the float operations in the same order as gguf-py's numpy code
//! (`(d * sc) * q - (dmin * m)`), so results are bit-exact with both. Rust
//! never contracts `a * b + c` into an FMA, which keeps that order honest.

use crate::block::*;

/// Decodes whole blocks: `src` holds `dst.len() / E` blocks of `B` bytes.
/// Callers have checked the lengths.
pub(crate) fn blocks<const B: usize, const E: usize>(
    src: &[u8],
    dst: &mut [f32],
    decode: fn(&[u8; B], &mut [f32; E]),
) {
    for (b, y) in src.chunks_exact(B).zip(dst.chunks_exact_mut(E)) {
        decode(
            b.try_into().expect("chunks_exact yields B bytes"),
            y.try_into().expect("chunks_exact_mut yields E elements"),
        );
    }
}

pub(crate) fn f32s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(4).zip(dst) {
        *y = f32::from_le_bytes(b.try_into().expect("chunks of 4 bytes"));
    }
}

pub(crate) fn f16s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst) {
        *y = f16_to_f32([b[0], b[1]]);
    }
}

pub(crate) fn bf16s(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(2).zip(dst) {
        *y = bf16_to_f32([b[0], b[1]]);
    }
}

pub(crate) fn q4_0(bytes: &[u8; BlockQ4_0::BYTES], y: &mut [f32; QK32]) {
    let b = BlockQ4_0::from_bytes(bytes);
    let d = f16_to_f32(b.d);
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * ((q & 0xF) as i32 - 8) as f32;
        y[j + 16] = d * ((q >> 4) as i32 - 8) as f32;
    }
}

pub(crate) fn q4_1(bytes: &[u8; BlockQ4_1::BYTES], y: &mut [f32; QK32]) {
    let b = BlockQ4_1::from_bytes(bytes);
    let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * (q & 0xF) as f32 + m;
        y[j + 16] = d * (q >> 4) as f32 + m;
    }
}

/// The five-bit values of a Q5_0 / Q5_1 block, 0..32.
fn q5_values(qh: [u8; 4], qs: &[u8; 16]) -> [u8; QK32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK32];
    for (j, &lo) in qs.iter().enumerate() {
        q[j] = (lo & 0xF) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (lo >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

pub(crate) fn q5_0(bytes: &[u8; BlockQ5_0::BYTES], y: &mut [f32; QK32]) {
    let b = BlockQ5_0::from_bytes(bytes);
    let d = f16_to_f32(b.d);
    for (y, q) in y.iter_mut().zip(q5_values(b.qh, &b.qs)) {
        *y = d * (q as i32 - 16) as f32;
    }
}

pub(crate) fn q5_1(bytes: &[u8; BlockQ5_1::BYTES], y: &mut [f32; QK32]) {
    let b = BlockQ5_1::from_bytes(bytes);
    let (d, m) = (f16_to_f32(b.d), f16_to_f32(b.m));
    for (y, q) in y.iter_mut().zip(q5_values(b.qh, &b.qs)) {
        *y = d * q as f32 + m;
    }
}

pub(crate) fn q8_0(bytes: &[u8; BlockQ8_0::BYTES], y: &mut [f32; QK32]) {
    let b = BlockQ8_0::from_bytes(bytes);
    let d = f16_to_f32(b.d);
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = d * q as i8 as f32;
    }
}

pub(crate) fn q2_k(bytes: &[u8; BlockQ2K::BYTES], y: &mut [f32; QK_K]) {
    let b = BlockQ2K::from_bytes(bytes);
    let (d, dmin) = (f16_to_f32(b.d), f16_to_f32(b.dmin));
    // Element e = 16g + l: byte 32 * (e / 128) + e % 32, bits 2 * ((e % 128) / 32).
    for (g, y) in y.chunks_exact_mut(16).enumerate() {
        let sc = b.scales[g];
        let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
        let qs = &b.qs[32 * (g / 8) + 16 * (g % 2)..][..16];
        let shift = 2 * ((g % 8) / 2);
        for (y, &q) in y.iter_mut().zip(qs) {
            *y = dl * ((q >> shift) & 3) as f32 - ml;
        }
    }
}

pub(crate) fn q3_k(bytes: &[u8; BlockQ3K::BYTES], y: &mut [f32; QK_K]) {
    let b = BlockQ3K::from_bytes(bytes);
    let d = f16_to_f32(b.d);
    // Low bits packed as Q2_K; the high bit of element e is bit e / 32 of
    // hmask[e % 32].
    for (g, y) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * (scale_q3k(g, &b.scales) as i32 - 32) as f32;
        let qs = &b.qs[32 * (g / 8) + 16 * (g % 2)..][..16];
        let hm = &b.hmask[16 * (g % 2)..][..16];
        let shift = 2 * ((g % 8) / 2);
        for ((y, &q), &h) in y.iter_mut().zip(qs).zip(hm) {
            // The high bit is stored inverted: clear means "subtract 4".
            let high_clear = (h >> (g / 2)) & 1 == 0;
            let q = ((q >> shift) & 3) as i32 - if high_clear { 4 } else { 0 };
            *y = dl * q as f32;
        }
    }
}

pub(crate) fn q4_k(bytes: &[u8; BlockQ4K::BYTES], y: &mut [f32; QK_K]) {
    let b = BlockQ4K::from_bytes(bytes);
    k4_groups(b.d, b.dmin, &b.scales, &b.qs, None, y);
}

pub(crate) fn q5_k(bytes: &[u8; BlockQ5K::BYTES], y: &mut [f32; QK_K]) {
    let b = BlockQ5K::from_bytes(bytes);
    k4_groups(b.d, b.dmin, &b.scales, &b.qs, Some(&b.qh), y);
}

/// Q4_K and Q5_K: eight groups of 32 with 6-bit scales and mins; `qh` is
/// Q5_K's fifth bits (bit g of byte l: element l of group g).
fn k4_groups(
    d: [u8; 2],
    dmin: [u8; 2],
    scales: &[u8; 12],
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    y: &mut [f32; QK_K],
) {
    let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
    for (g, y) in y.chunks_exact_mut(32).enumerate() {
        let (sc, m) = scale_min_k4(g, scales);
        let (dl, ml) = (d * sc as f32, dmin * m as f32);
        // Groups 2k and 2k+1 share bytes 32k..32k+32: low then high nibble.
        let qs = &qs[32 * (g / 2)..][..32];
        let shift = 4 * (g % 2);
        for (l, y) in y.iter_mut().enumerate() {
            let high = qh.map_or(0, |qh| ((qh[l] >> g) & 1) << 4);
            *y = dl * (((qs[l] >> shift) & 0xF) | high) as f32 - ml;
        }
    }
}

pub(crate) fn q6_k(bytes: &[u8; BlockQ6K::BYTES], y: &mut [f32; QK_K]) {
    let b = BlockQ6K::from_bytes(bytes);
    let d = f16_to_f32(b.d);
    // Within a 128-element half, quarter k (32 elements) takes the nibble
    // k / 2 of ql bytes 32 * (k % 2) .. +32 and bits 2k..2k+2 of qh.
    for (g, y) in y.chunks_exact_mut(16).enumerate() {
        let dl = d * b.scales[g] as i8 as f32;
        let (half, k, l0) = (g / 8, (g % 8) / 2, 16 * (g % 2));
        let ql = &b.ql[64 * half + 32 * (k % 2) + l0..][..16];
        let qh = &b.qh[32 * half + l0..][..16];
        for ((y, &lo), &hi) in y.iter_mut().zip(ql).zip(qh) {
            let q = ((lo >> (4 * (k / 2))) & 0xF) | (((hi >> (2 * k)) & 3) << 4);
            *y = dl * (q as i32 - 32) as f32;
        }
    }
}

pub(crate) fn q8_k(bytes: &[u8; BlockQ8K::BYTES], y: &mut [f32; QK_K]) {
    let b = BlockQ8K::from_bytes(bytes);
    let d = f32::from_le_bytes(b.d);
    for (y, &q) in y.iter_mut().zip(&b.qs) {
        *y = d * q as i8 as f32;
    }
}

pub(crate) fn iq4_nl(bytes: &[u8; BlockIq4Nl::BYTES], y: &mut [f32; QK32]) {
    let b = BlockIq4Nl::from_bytes(bytes);
    let d = f16_to_f32(b.d);
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * IQ4NL_VALUES[(q & 0xF) as usize] as f32;
        y[j + 16] = d * IQ4NL_VALUES[(q >> 4) as usize] as f32;
    }
}

pub(crate) fn iq4_xs(bytes: &[u8; BlockIq4Xs::BYTES], y: &mut [f32; QK_K]) {
    let b = BlockIq4Xs::from_bytes(bytes);
    let d = f16_to_f32(b.d);
    let scales_h = u16::from_le_bytes(b.scales_h);
    for (g, y) in y.chunks_exact_mut(32).enumerate() {
        let low = (b.scales_l[g / 2] >> (4 * (g % 2))) & 0xF;
        let high = ((scales_h >> (2 * g)) & 3) as u8;
        let dl = d * ((low | (high << 4)) as i32 - 32) as f32;
        for (j, &q) in b.qs[16 * g..][..16].iter().enumerate() {
            y[j] = dl * IQ4NL_VALUES[(q & 0xF) as usize] as f32;
            y[j + 16] = dl * IQ4NL_VALUES[(q >> 4) as usize] as f32;
        }
    }
}
