//! Decode-sized products on the tiled integer GEMV (`kiln_kernels::QTiles`,
//! AVX-512 VNNI): a weight's rows repacked once, on first use, into tiles
//! of 16 rows in the lanes of `vpdpbusd`, every token's activations split
//! into the three int8 planes the one-token integer GEMV uses, so a token
//! gets that path's arithmetic whether it runs alone or in a batch.
//!
//! The row-form GEMV is compute-bound on Zen 4 (~0.2 cycles a weight:
//! decoding and per-block scaling per row); the tiles decode a block once
//! for 16 rows and every token. Kernel bench, Zen 4, one thread, Q5_0
//! 2048 x 640 in cache: 1 token 75 -> 27 us, 8 tokens 604 -> 166 us (the
//! f32 GEMM: 306), 64 tokens 1,327 us (f32 GEMM 1,726); 65,536 rows from
//! DRAM 28 GB/s against 11.6; Q4_K 640 x 2048, 1 token 52 -> 23 us, 8
//! tokens 412 -> 167; Q6_K 640 x 2048, 1 token 59 -> 32, 8 tokens 469 ->
//! 197. Q5_0 prefills take them too (but on AMX): pp512 of the real 270M
//! 750-756 -> 776-825 tok/s; K-quants only up to [`K_QUANT_MAX_TOKENS`].

use kiln_kernels::{Isa, QTiles};
use kiln_model::Result;

use crate::matmul::{kernel_err, rows_per_task, with_block, with_planes, write_columns, Post};
use crate::par::{Par, SendPtr};
use crate::CpuWeight;

/// `KILN_QTILES=0` turns the tiles off (read once).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_QTILES").map_or(true, |v| v != "0"))
}

/// Most tokens a Q4_K / Q6_K product takes the tiles for. In a long
/// prefill their tiles lose to the f32 GEMM (pp512 of the real 270M, Zen
/// 4: 747-751 tok/s with every product on them, 789-798 with K-quants on
/// tiles up to 64 tokens; three int8 planes have no edge over f32 FMAs
/// there), so those products read the mapped rows again: faulted back
/// from the page cache, they then stay (handing them back after every
/// long product cost a server ~2% at 8 streams in refaults).
const K_QUANT_MAX_TOKENS: usize = 64;

/// Tokens per call of the tile kernel: a task's output block holds this
/// many tokens' outputs (a whole 512-token prefill's would be up to 4 MB
/// per thread; no speed difference measured at pp512).
const TOKEN_BLOCK: usize = 64;

/// `w`'s tiles where they run (AVX-512 VNNI, a type the tiles take, at
/// most [`K_QUANT_MAX_TOKENS`] tokens for K-quants), packed on first use.
/// Below AMX the rows they came from are then handed back to the OS, so
/// memory holds one copy (AMX prefill reads the rows; they stay there).
fn tiles<'w>(par: &Par, isa: Isa, w: &'w CpuWeight, n_tok: usize) -> Option<&'w QTiles> {
    use kiln_quant::GgmlType::{Q4K, Q5_0, Q6K};
    let k_quant = matches!(w.ty, Q4K | Q6K);
    if isa < Isa::Avx512Vnni
        || !(k_quant || w.ty == Q5_0)
        || (k_quant && n_tok > K_QUANT_MAX_TOKENS)
        || !enabled()
    {
        return None;
    }
    w.qtiles
        .get_or_init(|| {
            let _p = crate::profile::op(|| format!("  {}: packing GEMV tiles", w.ty), 0);
            let pool = Some(par.pool());
            let t = QTiles::pack(isa, w.ty, w.data(), w.row_bytes, w.rows, w.cols, pool)?;
            if isa < Isa::Amx && t.rows() == w.rows {
                w.gguf.release_pages(&w.name);
            }
            Some(t)
        })
        .as_ref()
}

/// [`crate::matmul::matmul`] on the tiles: `Ok(false)` where they do not
/// apply (the caller runs its other paths), including rows off the tiles
/// and non-finite activations (the f32 path reports those).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    par: &Par,
    isa: Isa,
    w: &CpuWeight,
    row0: usize,
    n_rows: usize,
    x: &[f32],
    n_tok: usize,
    out: &mut [f32],
    post: Option<&Post<'_>>,
) -> Result<bool> {
    let Some(t) = tiles(par, isa, w, n_tok) else {
        return Ok(false);
    };
    if !row0.is_multiple_of(16) || !n_rows.is_multiple_of(16) || row0 + n_rows > t.rows() {
        return Ok(false);
    }
    let err = std::sync::Mutex::new(None);
    let dst = SendPtr(out.as_mut_ptr());
    let ran = with_planes(par, x, n_tok, w.cols, |qxs| {
        let chunk = rows_per_task(par, n_rows, 16, 2048);
        par.run(n_rows.div_ceil(chunk), |i| {
            let c0 = i * chunk;
            let nr = chunk.min(n_rows - c0);
            with_block(TOKEN_BLOCK.min(n_tok) * nr, |block| {
                for t0 in (0..n_tok).step_by(TOKEN_BLOCK) {
                    let qs = &qxs[t0..n_tok.min(t0 + TOKEN_BLOCK)];
                    let yb = &mut block[..qs.len() * nr];
                    if let Err(e) = kiln_kernels::gemv_q_tiles(isa, t, row0 + c0, nr, qs, yb, nr) {
                        *err.lock().expect("error slot") = Some(e);
                        return;
                    }
                    if let Some(f) = post {
                        f(yb);
                    }
                    // SAFETY: `out` holds `n_tok * n_rows` values (checked
                    // by the caller) and this task alone writes columns
                    // `c0..c0 + nr` of every token row.
                    unsafe { write_columns(&dst, n_rows, c0, t0, yb, nr) };
                }
            });
        });
    });
    match (ran, err.into_inner().expect("error slot")) {
        (None, _) => Ok(false),
        (Some(()), Some(e)) => Err(kernel_err(w, e)),
        (Some(()), None) => Ok(true),
    }
}
