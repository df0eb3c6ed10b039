//! ISA-generic f32 kernels over strided rows (attention over a K/V cache):
//! several query vectors share each row load, so a cache row is read once
//! per group of heads rather than once per head.

use super::kern::Simd;

/// `out[h * n + j] = dot(q_h, m_j)` with `q_h = q[h * d..][..d]` for
/// `h < g` and `m_j = m[j * stride..][..d]`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn dot_rows<S: Simd>(
    s: S,
    q: &[f32],
    g: usize,
    d: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    // Up to four queries per pass: each row vector is loaded once for all
    // of them, and the four sums share one horizontal reduction.
    let mut h0 = 0;
    while h0 < g {
        let hb = (g - h0).min(4);
        let qs = &q[h0 * d..(h0 + hb) * d];
        let os = &mut out[h0 * n..(h0 + hb) * n];
        match hb {
            1 => dot_block::<S, 1>(s, qs, d, m, stride, n, os),
            2 => dot_block::<S, 2>(s, qs, d, m, stride, n, os),
            3 => dot_block::<S, 3>(s, qs, d, m, stride, n, os),
            _ => dot_block::<S, 4>(s, qs, d, m, stride, n, os),
        }
        h0 += hb;
    }
}

/// `H` queries against rows two at a time: per vector step two row loads
/// and `H` query loads feed `2 * H` FMAs (the loads, not the FMAs, bound
/// one row at a time).
#[inline(always)]
fn dot_block<S: Simd, const H: usize>(
    s: S,
    q: &[f32],
    d: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    let l = S::LANES;
    let main = d / l * l;
    assert!(q.len() >= H * d && out.len() >= H * n);
    let mut j = 0;
    while j + 2 <= n {
        let r0 = &m[j * stride..][..d];
        let r1 = &m[(j + 1) * stride..][..d];
        let mut a0 = [s.zero(); 4];
        let mut a1 = [s.zero(); 4];
        let mut c = 0;
        while c < main {
            let (v0, v1) = (s.load(&r0[c..]), s.load(&r1[c..]));
            for h in 0..H {
                let qv = s.load(&q[h * d + c..]);
                a0[h] = s.fma(v0, qv, a0[h]);
                a1[h] = s.fma(v1, qv, a1[h]);
            }
            c += l;
        }
        for (jj, (row, acc)) in [(r0, a0), (r1, a1)].into_iter().enumerate() {
            let sums = s.hsum4(acc);
            for h in 0..H {
                let mut v = sums[h];
                for i in main..d {
                    v += row[i] * q[h * d + i];
                }
                out[h * n + j + jj] = v;
            }
        }
        j += 2;
    }
    if j < n {
        let row = &m[j * stride..][..d];
        let mut acc = [s.zero(); 4];
        let mut c = 0;
        while c < main {
            let v = s.load(&row[c..]);
            for (h, a) in acc.iter_mut().enumerate().take(H) {
                *a = s.fma(v, s.load(&q[h * d + c..]), *a);
            }
            c += l;
        }
        let sums = s.hsum4(acc);
        for h in 0..H {
            let mut v = sums[h];
            for i in main..d {
                v += row[i] * q[h * d + i];
            }
            out[h * n + j] = v;
        }
    }
}

/// `acc[h * d..][..d] += sum_j p[h * n + j] * m_j` for `h < g` (rows as in
/// [`dot_rows`]).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) fn axpy_rows<S: Simd>(
    s: S,
    p: &[f32],
    g: usize,
    d: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    acc: &mut [f32],
) {
    let mut h0 = 0;
    while h0 < g {
        let hb = (g - h0).min(4);
        let ps = &p[h0 * n..(h0 + hb) * n];
        let a = &mut acc[h0 * d..(h0 + hb) * d];
        match hb {
            1 => axpy_block::<S, 1>(s, ps, d, m, stride, n, a),
            2 => axpy_block::<S, 2>(s, ps, d, m, stride, n, a),
            3 => axpy_block::<S, 3>(s, ps, d, m, stride, n, a),
            _ => axpy_block::<S, 4>(s, ps, d, m, stride, n, a),
        }
        h0 += hb;
    }
}

/// Rows per pass of [`axpy_block`]: a block of V rows stays in L1 while
/// each column strip of it is swept.
const AXPY_ROWS: usize = 32;

/// `H` heads: a strip of `4 * LANES` output columns of every head lives
/// in `4 * H` registers across a block of rows, so each accumulator is
/// loaded and stored once per block instead of once per row.
#[inline(always)]
fn axpy_block<S: Simd, const H: usize>(
    s: S,
    p: &[f32],
    d: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    acc: &mut [f32],
) {
    let l = S::LANES;
    let strip = 4 * l;
    let main = d / strip * strip;
    let vmain = d / l * l;
    assert!(p.len() >= H * n && acc.len() >= H * d);
    for j0 in (0..n).step_by(AXPY_ROWS) {
        let nb = AXPY_ROWS.min(n - j0);
        let mut c = 0;
        while c < main {
            let mut a = [[s.zero(); 4]; H];
            for (h, ah) in a.iter_mut().enumerate() {
                for (u, v) in ah.iter_mut().enumerate() {
                    *v = s.load(&acc[h * d + c + u * l..]);
                }
            }
            for j in j0..j0 + nb {
                let row = &m[j * stride + c..][..strip];
                let v = [
                    s.load(row),
                    s.load(&row[l..]),
                    s.load(&row[2 * l..]),
                    s.load(&row[3 * l..]),
                ];
                for (h, ah) in a.iter_mut().enumerate() {
                    let w = s.splat(p[h * n + j]);
                    for (x, &vv) in ah.iter_mut().zip(&v) {
                        *x = s.fma(w, vv, *x);
                    }
                }
            }
            for (h, ah) in a.iter().enumerate() {
                for (u, &v) in ah.iter().enumerate() {
                    s.store(&mut acc[h * d + c + u * l..], v);
                }
            }
            c += strip;
        }
        // Whole vectors past the last strip, then the scalar tail.
        while c < vmain {
            for h in 0..H {
                let mut x = s.load(&acc[h * d + c..]);
                for j in j0..j0 + nb {
                    x = s.fma(s.splat(p[h * n + j]), s.load(&m[j * stride + c..]), x);
                }
                s.store(&mut acc[h * d + c..], x);
            }
            c += l;
        }
        for h in 0..H {
            for i in vmain..d {
                let mut x = acc[h * d + i];
                for j in j0..j0 + nb {
                    x += p[h * n + j] * m[j * stride + i];
                }
                acc[h * d + i] = x;
            }
        }
    }
}

/// `tanh` as a clamped rational function (the odd 13/even 6 minimax fit
/// Eigen uses): a few ulp over all f32, NaN in gives NaN out.
#[inline(always)]
fn tanh<S: Simd>(s: S, x: S::F) -> S::F {
    const A: [f32; 7] = [
        4.893_524_6e-3,
        6.372_619_3e-4,
        1.485_722_4e-5,
        5.122_297e-8,
        -8.604_672e-11,
        2.000_188e-13,
        -2.760_768_5e-16,
    ];
    const B: [f32; 4] = [4.893_525e-3, 2.268_434_6e-3, 1.185_347_1e-4, 1.198_258_4e-6];
    // NaN-preserving clamp: min/max return their second operand on NaN.
    let x = s.min(s.splat(9.0), s.max(s.splat(-9.0), x));
    let x2 = s.mul(x, x);
    let mut p = s.splat(A[6]);
    for &a in A[..6].iter().rev() {
        p = s.fma(p, x2, s.splat(a));
    }
    let mut q = s.splat(B[3]);
    for &b in B[..3].iter().rev() {
        q = s.fma(q, x2, s.splat(b));
    }
    s.div(s.mul(p, x), q)
}

/// `x = c * tanh(x / c)`.
#[inline(always)]
pub(super) fn softcap<S: Simd>(s: S, x: &mut [f32], c: f32) {
    let (cv, inv) = (s.splat(c), s.splat(1.0 / c));
    let mut chunks = x.chunks_exact_mut(S::LANES);
    for ch in &mut chunks {
        let v = s.mul(cv, tanh(s, s.mul(s.load(ch), inv)));
        s.store(ch, v);
    }
    for v in chunks.into_remainder() {
        *v = c * (*v / c).tanh();
    }
}

/// `g = gelu_tanh(g) * u`.
#[inline(always)]
pub(super) fn gelu_mul<S: Simd>(s: S, g: &mut [f32], u: &[f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    let (c, c3, half) = (s.splat(C), s.splat(C * 0.044_715), s.splat(0.5));
    let one = s.splat(1.0);
    let n = g.len().min(u.len());
    let main = n / S::LANES * S::LANES;
    for (gc, uc) in g[..main]
        .chunks_exact_mut(S::LANES)
        .zip(u[..main].chunks_exact(S::LANES))
    {
        let x = s.load(gc);
        // C * (x + 0.044715 x^3) = x * (C + C * 0.044715 * x^2)
        let inner = s.mul(x, s.fma(c3, s.mul(x, x), c));
        let t = s.add(one, tanh(s, inner));
        s.store(gc, s.mul(s.mul(s.mul(half, x), t), s.load(uc)));
    }
    for (a, &b) in g[main..n].iter_mut().zip(&u[main..n]) {
        *a = crate::scalar::gelu_tanh(*a) * b;
    }
}

/// `exp(x)` (Cephes `expf`: `2^n * p(r)`, `r = x - n ln 2`), about 2 ulp;
/// inputs are clamped to where the result is a normal float or 0-ish, so
/// `-inf` gives ~1e-38 rather than 0 (a negligible softmax weight).
#[inline(always)]
fn exp<S: Simd>(s: S, x: S::F) -> S::F {
    let x = s.min(s.splat(88.3), s.max(s.splat(-87.3), x));
    let n = s.round(s.mul(x, s.splat(std::f32::consts::LOG2_E)));
    let r = s.fma(n, s.splat(-0.693_359_4), x);
    let r = s.fma(n, s.splat(2.121_944_4e-4), r);
    let mut p = s.splat(1.987_569_1e-4);
    for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = s.fma(p, r, s.splat(c));
    }
    let y = s.fma(s.mul(p, r), r, s.add(r, s.splat(1.0)));
    s.mul(y, s.pow2i(n))
}

/// One online-softmax step over a block of raw scores: `x = scale * x`,
/// then `cap * tanh(x / cap)`, `mx = max(m, max x)`, `x = exp(x - mx)`;
/// returns `(mx, sum x)`.
#[inline(always)]
pub(super) fn softmax_step<S: Simd>(
    s: S,
    x: &mut [f32],
    scale: f32,
    cap: Option<f32>,
    m: f32,
) -> (f32, f32) {
    let l = S::LANES;
    let main = x.len() / l * l;
    let sv = s.splat(scale);
    let mut mv = s.splat(f32::NEG_INFINITY);
    let (xm, xt) = x.split_at_mut(main);
    for ch in xm.chunks_exact_mut(l) {
        let mut v = s.mul(s.load(ch), sv);
        if let Some(c) = cap {
            v = s.mul(s.splat(c), tanh(s, s.mul(v, s.splat(1.0 / c))));
        }
        s.store(ch, v);
        // NaN (second operand) wins and then poisons the row's output.
        mv = s.max(mv, v);
    }
    let mut lanes = [0.0f32; 16];
    s.store(&mut lanes, mv);
    let mut mx = lanes[..l]
        .iter()
        .fold(m, |a, &b| if b.is_nan() || b > a { b } else { a });
    for v in xt.iter_mut() {
        *v *= scale;
        if let Some(c) = cap {
            *v = c * (*v / c).tanh();
        }
        if v.is_nan() || *v > mx {
            mx = *v;
        }
    }
    let (neg, mut sum) = (s.splat(-mx), s.zero());
    for ch in xm.chunks_exact_mut(l) {
        let e = exp(s, s.add(s.load(ch), neg));
        s.store(ch, e);
        sum = s.add(sum, e);
    }
    let mut total = s.hsum(sum);
    for v in xt.iter_mut() {
        *v = (*v - mx).exp();
        total += *v;
    }
    (mx, total)
}
