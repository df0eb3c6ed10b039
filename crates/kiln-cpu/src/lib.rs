//! CPU backend: weights stay packed (as mapped from the GGUF file) and are
//! dequantized inside the kernels; activations are f32, accumulation f32,
//! rayon-parallel over output rows.

use std::cell::RefCell;
use std::sync::Arc;

use kiln_gguf::Gguf;
use kiln_model::{AttnParams, Backend, ModelError, PastKv, Result, RopeConfig};
use kiln_quant::GgmlType;
use rayon::prelude::*;

/// Weight rows dequantized together into one f32 tile during prefill and
/// reused for every token of the batch.
const TILE_ROWS: usize = 16;
/// Output rows per parallel task for a single token (decode).
const DECODE_ROWS: usize = 64;

thread_local! {
    static TILE: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static ROPE_CS: RefCell<Vec<(f32, f32)>> = const { RefCell::new(Vec::new()) };
}

/// A packed matrix bound by tensor name in a mapped GGUF file.
pub struct CpuWeight {
    gguf: Arc<Gguf>,
    name: String,
    ty: GgmlType,
    cols: usize,
    rows: usize,
    row_bytes: usize,
}

impl CpuWeight {
    fn data(&self) -> &[u8] {
        // The file is immutable and the name was checked at bind time.
        self.gguf
            .tensor(&self.name)
            .map(|t| t.data)
            .expect("bound tensor present in its file")
    }
}

#[derive(Clone, Debug, Default)]
pub struct CpuBackend;

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend
    }
}

fn dequant(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    // Lengths and type were validated when the weight was bound.
    kiln_quant::dequantize(ty, src, dst).expect("validated packed row");
}

/// f32 dot product over eight independent lanes (vectorizable).
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut lanes = [0.0f32; 8];
    let split = n / 8 * 8;
    for (ca, cb) in a[..split].chunks_exact(8).zip(b[..split].chunks_exact(8)) {
        for k in 0..8 {
            lanes[k] += ca[k] * cb[k];
        }
    }
    let mut tail = 0.0f32;
    for (p, q) in a[split..].iter().zip(&b[split..]) {
        tail += p * q;
    }
    reduce8(&lanes) + tail
}

/// Sum of eight lanes in the fixed order [`dot`] uses.
#[inline]
fn reduce8(l: &[f32; 8]) -> f32 {
    ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]))
}

#[inline]
fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

fn check(what: &str, need: usize, have: usize) -> Result<()> {
    if need > have {
        return Err(ModelError::Backend(format!(
            "{what}: needs {need} elements, buffer has {have}"
        )));
    }
    Ok(())
}

impl CpuBackend {
    /// `out[t*n_rows + r]` for a batch: each task dequantizes `TILE_ROWS`
    /// weight rows once and multiplies them with every token.
    fn matmul_batch(
        &self,
        w: &CpuWeight,
        row0: usize,
        n_rows: usize,
        x: &[f32],
        n_tok: usize,
        out: &mut [f32],
    ) {
        let cols = w.cols;
        let data = w.data();
        // Transposed result [n_rows, n_tok] so tasks own contiguous chunks.
        let mut tr = vec![0.0f32; n_rows * n_tok];
        tr.par_chunks_mut(TILE_ROWS * n_tok)
            .enumerate()
            .for_each(|(ci, chunk)| {
                let r_start = row0 + ci * TILE_ROWS;
                let nr = chunk.len() / n_tok;
                TILE.with(|t| {
                    let mut tile = t.borrow_mut();
                    tile.resize(TILE_ROWS * cols, 0.0);
                    for j in 0..nr {
                        let r = r_start + j;
                        dequant(
                            w.ty,
                            &data[r * w.row_bytes..(r + 1) * w.row_bytes],
                            &mut tile[j * cols..(j + 1) * cols],
                        );
                    }
                    for t in 0..n_tok {
                        let xr = &x[t * cols..(t + 1) * cols];
                        for j in 0..nr {
                            chunk[j * n_tok + t] = dot(&tile[j * cols..(j + 1) * cols], xr);
                        }
                    }
                });
            });
        out[..n_tok * n_rows]
            .par_chunks_mut(n_rows)
            .enumerate()
            .for_each(|(t, orow)| {
                for (r, o) in orow.iter_mut().enumerate() {
                    *o = tr[r * n_tok + t];
                }
            });
    }

    fn matmul_one(&self, w: &CpuWeight, row0: usize, n_rows: usize, x: &[f32], out: &mut [f32]) {
        let cols = w.cols;
        let data = w.data();
        out[..n_rows]
            .par_chunks_mut(DECODE_ROWS)
            .enumerate()
            .for_each(|(ci, chunk)| {
                TILE.with(|t| {
                    let mut row = t.borrow_mut();
                    row.resize(cols, 0.0);
                    for (j, o) in chunk.iter_mut().enumerate() {
                        let r = row0 + ci * DECODE_ROWS + j;
                        dequant(
                            w.ty,
                            &data[r * w.row_bytes..(r + 1) * w.row_bytes],
                            &mut row,
                        );
                        *o = dot(&row, &x[..cols]);
                    }
                });
            });
    }
}

impl Backend for CpuBackend {
    type Buf = Vec<f32>;
    type Weight = CpuWeight;

    fn name(&self) -> &str {
        "cpu"
    }

    fn load_weight(&self, gguf: &Arc<Gguf>, name: &str) -> Result<CpuWeight> {
        let info = gguf
            .tensor_info(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        if !kiln_quant::is_supported(info.ty) {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("type {} has no CPU kernel", info.ty),
            });
        }
        if info.dims.is_empty() || info.dims.len() > 3 {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!("shape {:?} is not a 2-D or 3-D matrix", info.dims),
            });
        }
        let cols = info.row_len();
        if cols % info.ty.block_elems() != 0 {
            return Err(ModelError::BadTensor {
                name: name.to_string(),
                reason: format!(
                    "row length {cols} is not a multiple of the {} block size {}",
                    info.ty,
                    info.ty.block_elems()
                ),
            });
        }
        Ok(CpuWeight {
            gguf: gguf.clone(),
            name: name.to_string(),
            ty: info.ty,
            cols,
            rows: info.n_rows(),
            row_bytes: info.row_bytes(),
        })
    }

    fn weight_shape(&self, w: &CpuWeight) -> (usize, usize) {
        (w.cols, w.rows)
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; len])
    }

    fn upload(&self, data: &[f32]) -> Result<Vec<f32>> {
        Ok(data.to_vec())
    }

    fn buf_len(&self, b: &Vec<f32>) -> usize {
        b.len()
    }

    fn download(&self, b: &Vec<f32>, offset: usize, out: &mut [f32]) -> Result<()> {
        check("download", offset + out.len(), b.len())?;
        out.copy_from_slice(&b[offset..offset + out.len()]);
        Ok(())
    }

    fn embed(&self, table: &CpuWeight, ids: &[u32], scale: f32, out: &mut Vec<f32>) -> Result<()> {
        let cols = table.cols;
        check("embed", ids.len() * cols, out.len())?;
        let data = table.data();
        for (t, &id) in ids.iter().enumerate() {
            let r = id as usize;
            if r >= table.rows {
                return Err(ModelError::Invalid(format!(
                    "token {id} out of range for {} ({} rows)",
                    table.name, table.rows
                )));
            }
            let dst = &mut out[t * cols..(t + 1) * cols];
            dequant(
                table.ty,
                &data[r * table.row_bytes..(r + 1) * table.row_bytes],
                dst,
            );
            dst.iter_mut().for_each(|v| *v *= scale);
        }
        Ok(())
    }

    fn matmul(
        &self,
        w: &CpuWeight,
        row0: usize,
        n_rows: usize,
        x: &Vec<f32>,
        n_tok: usize,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if row0 + n_rows > w.rows {
            return Err(ModelError::Backend(format!(
                "{}: rows {row0}..{} out of {}",
                w.name,
                row0 + n_rows,
                w.rows
            )));
        }
        check(&format!("matmul {} input", w.name), n_tok * w.cols, x.len())?;
        check(
            &format!("matmul {} output", w.name),
            n_tok * n_rows,
            out.len(),
        )?;
        if n_tok == 1 {
            self.matmul_one(w, row0, n_rows, x, out);
        } else {
            self.matmul_batch(w, row0, n_rows, x, n_tok, out);
        }
        Ok(())
    }

    fn rms_norm(
        &self,
        x: &mut Vec<f32>,
        n_groups: usize,
        dim: usize,
        w: Option<&Vec<f32>>,
        eps: f32,
    ) -> Result<()> {
        check("rms_norm", n_groups * dim, x.len())?;
        if let Some(w) = w {
            check("rms_norm weight", dim, w.len())?;
        }
        x[..n_groups * dim].par_chunks_mut(dim).for_each(|g| {
            // Sum of squares in f64: residual rows reach |x| ~ 1e4 on Gemma 3.
            let ss: f64 = g.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            let inv = (1.0 / (ss / dim as f64 + f64::from(eps)).sqrt()) as f32;
            match w {
                Some(w) => g.iter_mut().zip(w).for_each(|(v, &s)| *v = *v * inv * s),
                None => g.iter_mut().for_each(|v| *v *= inv),
            }
        });
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        p0: usize,
        rope: &RopeConfig,
    ) -> Result<()> {
        let row = n_heads * head_dim;
        check("rope", n_tok * row, x.len())?;
        let half = rope.n_rot / 2;
        if half == 0 {
            return Ok(());
        }
        // Per-pair inverse frequencies, in f64 (angles reach 1e5 radians).
        let inv: Vec<f64> = (0..half)
            .map(|i| {
                let f = f64::from(rope.base).powf(-2.0 * i as f64 / rope.n_rot as f64)
                    * f64::from(rope.freq_scale);
                match &rope.freq_factors {
                    Some(ff) => f / f64::from(ff.get(i).copied().unwrap_or(1.0)),
                    None => f,
                }
            })
            .collect();
        x[..n_tok * row]
            .par_chunks_mut(row)
            .enumerate()
            .for_each(|(t, r)| {
                let pos = (p0 + t) as f64;
                ROPE_CS.with(|cs| {
                    let mut cs = cs.borrow_mut();
                    cs.clear();
                    cs.extend(inv.iter().map(|&f| {
                        let a = pos * f;
                        (a.cos() as f32, a.sin() as f32)
                    }));
                    for h in r.chunks_mut(head_dim) {
                        for (i, &(c, s)) in cs.iter().enumerate() {
                            let (a, b) = (h[i], h[i + half]);
                            h[i] = a * c - b * s;
                            h[i + half] = a * s + b * c;
                        }
                    }
                });
            });
        Ok(())
    }

    fn attention(
        &self,
        q: &Vec<f32>,
        cur_k: &Vec<f32>,
        cur_v: &Vec<f32>,
        past: Option<PastKv<'_, Self>>,
        p: &AttnParams,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        let hd = p.head_dim;
        let qd = p.n_head * hd;
        let kvd = p.n_kv_head * hd;
        check("attention q", p.n_tok * qd, q.len())?;
        check("attention k", p.n_tok * kvd, cur_k.len())?;
        check("attention v", p.n_tok * kvd, cur_v.len())?;
        check("attention out", p.n_tok * qd, out.len())?;
        if let Some(pk) = &past {
            let held = p.p0 - pk.start.min(p.p0);
            if held > pk.rows || pk.k.len() < pk.rows * kvd || pk.v.len() < pk.rows * kvd {
                return Err(ModelError::Backend(format!(
                    "attention: cache of {} rows cannot hold positions {}..{}",
                    pk.rows, pk.start, p.p0
                )));
            }
        }
        let group = p.n_head / p.n_kv_head;
        out[..p.n_tok * qd]
            .par_chunks_mut(hd)
            .enumerate()
            .for_each(|(idx, acc)| {
                let (t, h) = (idx / p.n_head, idx % p.n_head);
                let kvh = h / group;
                let pos = p.p0 + t;
                let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w));
                let qv = &q[t * qd + h * hd..t * qd + (h + 1) * hd];
                acc.iter_mut().for_each(|a| *a = 0.0);
                // Online softmax: running max m and normaliser l.
                let mut m = f32::NEG_INFINITY;
                let mut l = 0.0f32;
                let mut visit = |k: &[f32], v: &[f32]| {
                    let mut s = dot(qv, k) * p.scale;
                    if let Some(c) = p.softcap {
                        s = c * (s / c).tanh();
                    }
                    if s > m {
                        let corr = (m - s).exp();
                        l = l * corr + 1.0;
                        for (a, &x) in acc.iter_mut().zip(v) {
                            *a = *a * corr + x;
                        }
                        m = s;
                    } else {
                        let e = (s - m).exp();
                        l += e;
                        for (a, &x) in acc.iter_mut().zip(v) {
                            *a += e * x;
                        }
                    }
                };
                if let Some(pk) = &past {
                    for kp in lo.max(pk.start)..p.p0 {
                        let off = (kp % pk.rows) * kvd + kvh * hd;
                        visit(&pk.k[off..off + hd], &pk.v[off..off + hd]);
                    }
                }
                for kp in lo.max(p.p0)..=pos {
                    let off = (kp - p.p0) * kvd + kvh * hd;
                    visit(&cur_k[off..off + hd], &cur_v[off..off + hd]);
                }
                let inv = 1.0 / l;
                acc.iter_mut().for_each(|a| *a *= inv);
            });
        Ok(())
    }

    fn gelu_mul(&self, gate: &mut Vec<f32>, up: &Vec<f32>, n: usize) -> Result<()> {
        check("gelu_mul", n, gate.len().min(up.len()))?;
        gate[..n]
            .par_chunks_mut(4096)
            .zip(up[..n].par_chunks(4096))
            .for_each(|(g, u)| {
                for (a, &b) in g.iter_mut().zip(u) {
                    *a = gelu_tanh(*a) * b;
                }
            });
        Ok(())
    }

    fn add(&self, x: &mut Vec<f32>, y: &Vec<f32>, n: usize) -> Result<()> {
        check("add", n, x.len().min(y.len()))?;
        x[..n].iter_mut().zip(&y[..n]).for_each(|(a, &b)| *a += b);
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32, n: usize) -> Result<()> {
        check("scale", n, x.len())?;
        x[..n].iter_mut().for_each(|a| *a *= s);
        Ok(())
    }

    fn copy_strided(
        &self,
        src: &Vec<f32>,
        src_off: usize,
        src_stride: usize,
        dst: &mut Vec<f32>,
        dst_off: usize,
        dst_stride: usize,
        rows: usize,
        len: usize,
        alpha: f32,
        accumulate: bool,
    ) -> Result<()> {
        if rows == 0 || len == 0 {
            return Ok(());
        }
        check(
            "copy src",
            src_off + (rows - 1) * src_stride + len,
            src.len(),
        )?;
        check(
            "copy dst",
            dst_off + (rows - 1) * dst_stride + len,
            dst.len(),
        )?;
        for r in 0..rows {
            let s = &src[src_off + r * src_stride..src_off + r * src_stride + len];
            let d = &mut dst[dst_off + r * dst_stride..dst_off + r * dst_stride + len];
            match (accumulate, alpha == 1.0) {
                (false, true) => d.copy_from_slice(s),
                (false, false) => d.iter_mut().zip(s).for_each(|(a, &b)| *a = alpha * b),
                (true, _) => d.iter_mut().zip(s).for_each(|(a, &b)| *a += alpha * b),
            }
        }
        Ok(())
    }

    fn softcap(&self, x: &mut Vec<f32>, c: f32, n: usize) -> Result<()> {
        check("softcap", n, x.len())?;
        x[..n].par_chunks_mut(4096).for_each(|ch| {
            ch.iter_mut().for_each(|v| *v = c * (*v / c).tanh());
        });
        Ok(())
    }

    fn argmax_head(&self, w: &CpuWeight, h: &Vec<f32>) -> Result<u32> {
        check("argmax_head", w.cols, h.len())?;
        let cols = w.cols;
        let data = w.data();
        let n_chunks = w.rows.div_ceil(DECODE_ROWS * 4);
        // Per chunk: the best finite logit and the first non-finite one (a
        // NaN must be reported, not lost to `z > best` being false).
        let (best, bad) = (0..n_chunks)
            .into_par_iter()
            .map(|ci| {
                TILE.with(|t| {
                    let mut row = t.borrow_mut();
                    row.resize(cols, 0.0);
                    let mut best = (f32::NEG_INFINITY, u32::MAX);
                    let mut bad: Option<(u32, f32)> = None;
                    let start = ci * DECODE_ROWS * 4;
                    for r in start..(start + DECODE_ROWS * 4).min(w.rows) {
                        dequant(
                            w.ty,
                            &data[r * w.row_bytes..(r + 1) * w.row_bytes],
                            &mut row,
                        );
                        let z = dot(&row, &h[..cols]);
                        if !z.is_finite() {
                            bad = bad.or(Some((r as u32, z)));
                        } else if z > best.0 {
                            best = (z, r as u32);
                        }
                    }
                    (best, bad)
                })
            })
            .reduce(
                || ((f32::NEG_INFINITY, u32::MAX), None),
                |(a, abad), (b, bbad)| {
                    let best = if b.0 > a.0 || (b.0 == a.0 && b.1 < a.1) {
                        b
                    } else {
                        a
                    };
                    let bad = match (abad, bbad) {
                        (Some(x), Some(y)) => Some(if y.0 < x.0 { y } else { x }),
                        (x, y) => x.or(y),
                    };
                    (best, bad)
                },
            );
        if let Some((token, value)) = bad {
            // The model fills in the position.
            return Err(ModelError::NonFiniteLogit {
                pos: 0,
                token,
                value,
            });
        }
        if best.1 == u32::MAX {
            return Err(ModelError::Backend(format!(
                "argmax over {}: no rows",
                w.name
            )));
        }
        Ok(best.1)
    }
}
