//! Portable path: `kiln_quant`'s scalar dequantizers plus plain dots. It is
//! the reference the SIMD kernels are tested against and the fallback for
//! types without a fast path. Callers have validated every length.

use kiln_quant::GgmlType;

/// Elements dequantized at a time: a multiple of every block size.
const TILE: usize = 256;

pub(crate) fn gemv(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    packed: usize,
    x: &[f32],
    y: &mut [f32],
) {
    for (r, yr) in y.iter_mut().enumerate() {
        let row = &w[r * row_bytes..][..packed];
        *yr = kiln_quant::vec_dot_f32(ty, row, x).expect("lengths checked by the caller");
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    k: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    ldy: usize,
) {
    let tile_bytes = TILE / ty.block_elems() * ty.block_bytes();
    let packed = k / ty.block_elems() * ty.block_bytes();
    let mut buf = [0.0f32; TILE];
    for r in 0..rows {
        for t in 0..n {
            y[t * ldy + r] = 0.0;
        }
        let row = &w[r * row_bytes..][..packed];
        for (i, src) in row.chunks(tile_bytes).enumerate() {
            let k0 = i * TILE;
            let wt = &mut buf[..TILE.min(k - k0)];
            kiln_quant::dequantize(ty, src, wt).expect("lengths checked by the caller");
            for t in 0..n {
                y[t * ldy + r] += dot(wt, &x[t * k + k0..][..wt.len()]);
            }
        }
    }
}

/// f32 dot over eight lanes so the compiler can vectorize it.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a8, ar) = a.split_at(a.len() / 8 * 8);
    let (b8, br) = b.split_at(a8.len());
    for (ca, cb) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for j in 0..8 {
            lanes[j] += ca[j] * cb[j];
        }
    }
    let tail: f32 = ar.iter().zip(br).map(|(p, q)| p * q).sum();
    lanes.iter().sum::<f32>() + tail
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_rows(
    q: &[f32],
    g: usize,
    d: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    for j in 0..n {
        let row = &m[j * stride..][..d];
        for h in 0..g {
            out[h * n + j] = dot(&q[h * d..][..d], row);
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn axpy_rows(
    p: &[f32],
    g: usize,
    d: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    acc: &mut [f32],
) {
    for j in 0..n {
        let row = &m[j * stride..][..d];
        for h in 0..g {
            let w = p[h * n + j];
            for (a, &v) in acc[h * d..][..d].iter_mut().zip(row) {
                *a += w * v;
            }
        }
    }
}

/// GELU, tanh form.
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}
