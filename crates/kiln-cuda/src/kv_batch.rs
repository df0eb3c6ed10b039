//! A step's attention and K/V stores over all its sequences: each one
//! launch, every sequence's cache found in the step's KV table
//! ([`CudaStep`], filled by `Backend::bind_kv`), so a captured graph
//! replays for any caches. The host arguments (`pasts`, `stores`) are
//! checked against the table: they must name the caches it holds.

use kiln_model::{AttnParams, Backend, KvStore, ModelError, PastKv, Result};

use crate::attention::AttnBufs;
use crate::step::KvEntry;
use crate::{CudaBackend, CudaBuf, CudaStep};

/// `Backend::attention_batch`: every one-row sequence of the step in one
/// launch, each longer one (a prefill chunk) on its own; calls that do
/// not follow the step's layout (`params[i]` for sequence `i`, its rows)
/// per sequence.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention<'c>(
    c: &CudaBackend,
    layer: usize,
    q: &CudaBuf,
    cur_k: &CudaBuf,
    cur_v: &CudaBuf,
    pasts: &mut dyn Iterator<Item = Option<PastKv<'c, CudaBackend>>>,
    params: &[AttnParams],
    step: &CudaStep,
    out: &mut CudaBuf,
) -> Result<()> {
    let laid_out = params.len() == step.host.seqs.len()
        && params
            .iter()
            .zip(&step.host.seqs)
            .enumerate()
            .all(|(i, (p, sp))| p.seq == i && (p.row0, p.n_tok) == (sp.row0, sp.n_rows));
    if !laid_out {
        for (past, p) in pasts.zip(params) {
            c.attention(q, cur_k, cur_v, past, p, step, out)?;
        }
        return Ok(());
    }
    let first = &params[0];
    let (mut n, mut decode) = (0, 0);
    for (i, (past, p)) in pasts.zip(params).enumerate() {
        n += 1;
        if p.n_tok != 1 {
            c.attention(q, cur_k, cur_v, past, p, step, out)?;
            continue;
        }
        decode += 1;
        CudaBackend::seq_of(step, i, p.p0)?;
        if (p.n_head, p.n_kv_head, p.head_dim) != (first.n_head, first.n_kv_head, first.head_dim) {
            return Err(ModelError::Backend(format!(
                "attention: sequence {i} has other head shapes than sequence 0"
            )));
        }
        let bound = step.kv_entry(layer, i);
        match (past, bound) {
            (Some(pk), Some(e)) => {
                let named = (c.gpu.ptr(&pk.k.data, 0), c.gpu.ptr(&pk.v.data, 0), pk.rows);
                if named != (e.k, e.v, e.rows as usize) {
                    return Err(ModelError::Backend(format!(
                        "attention: sequence {i}'s cache of layer {layer} is not the one the step bound"
                    )));
                }
                // The kernel finds the oldest cached position from p0
                // and the rows, as the cache lays them out.
                if pk.start != p.p0.saturating_sub(pk.rows) {
                    return Err(ModelError::Backend(format!(
                        "attention: cache of {} rows starting at {} cannot hold positions before {}",
                        pk.rows, pk.start, p.p0
                    )));
                }
            }
            (Some(_), None) => {
                return Err(ModelError::Backend(format!(
                    "attention: sequence {i}'s cache of layer {layer} was not bound to the step"
                )))
            }
            (None, _) if p.p0 > 0 => {
                return Err(ModelError::Backend(format!(
                    "attention: positions before {} have no cache",
                    p.p0
                )))
            }
            // A fresh sequence (its past unread) or a padding row.
            (None, _) => {}
        }
    }
    if n != params.len() {
        return Err(ModelError::Backend(format!(
            "attention of {} sequences given {n} caches",
            params.len()
        )));
    }
    if decode == 0 {
        return Ok(());
    }
    let bufs = AttnBufs {
        q: &q.data,
        cur_k: &cur_k.data,
        cur_v: &cur_v.data,
        past: None,
        out: &mut out.data,
        seq_p0: step.seq_p0_ptr(&c.gpu),
    };
    let g = &c.gpu;
    let table = (
        step.kv_table_ptr(g, layer)?,
        step.seq_end_ptr(g),
        step.seq_row0_ptr(g),
    );
    c.attention.run_batch(g, bufs, table, params)
}

/// `Backend::store_kv_batch`: every row of the step into its sequence's
/// cache of `layer`, one launch. `stores` must name exactly the caches
/// the step bound for the layer, each sequence's rows as the step lays
/// them out.
pub(crate) fn store<'c>(
    c: &CudaBackend,
    layer: usize,
    k: &CudaBuf,
    v: &CudaBuf,
    stores: &mut dyn Iterator<Item = Result<KvStore<'c, CudaBackend>>>,
    step: &CudaStep,
) -> Result<()> {
    // (ring, row length) of the first; how many.
    let (mut kind, mut named_count) = (None, 0);
    for st in stores {
        let st = st?;
        named_count += 1;
        let (ring, row_len) = *kind.get_or_insert((st.dst.ring, st.dst.row_len));
        let i = st.seq;
        CudaBackend::seq_of(step, i, st.p0)?;
        let sp = step.host.seqs[i];
        if (st.src_row0, st.n) != (sp.row0, sp.n_rows) {
            return Err(ModelError::Backend(format!(
                "store_kv: sequence {i}'s rows {}..{} are not its rows of the step",
                st.src_row0,
                st.src_row0 + st.n
            )));
        }
        let d = &st.dst;
        if (d.ring, d.row_len) != (ring, row_len) {
            return Err(ModelError::Backend(format!(
                "store_kv: layer {layer}'s caches differ in kind or row length"
            )));
        }
        if (!d.ring && st.p0 + st.n > d.rows) || (d.ring && d.rows == 0) {
            return Err(ModelError::Backend(format!(
                "store_kv: {} cache rows cannot take positions up to {}",
                d.rows,
                st.p0 + st.n
            )));
        }
        let named = KvEntry {
            k: c.gpu.ptr(&d.k.data, 0),
            v: c.gpu.ptr(&d.v.data, 0),
            rows: crate::ops::to_u32("KV cache rows", d.rows)?,
        };
        if step.kv_entry(layer, i) != Some(named)
            || d.k.data.len() < d.rows * row_len
            || d.v.data.len() < d.rows * row_len
        {
            return Err(ModelError::Backend(format!(
                "store_kv: sequence {i}'s cache of layer {layer} is not the one the step bound"
            )));
        }
    }
    // The kernel stores every sequence with a bound cache: those must be
    // exactly the ones named here.
    let Some((ring, row_len)) = kind else {
        return Ok(());
    };
    let bound = (0..step.host.seqs.len())
        .filter(|&i| step.kv_entry(layer, i).is_some())
        .count();
    if bound != named_count {
        return Err(ModelError::Backend(format!(
            "store_kv: the step bound {bound} caches of layer {layer}, the call names {named_count}"
        )));
    }
    let g = &c.gpu;
    let ptrs = (
        step.row_seq_ptr(g),
        step.positions_ptr(g),
        step.seq_end_ptr(g),
    );
    let kv = step.kv_table_ptr(g, layer)?;
    let n = step.host.rows();
    c.attention
        .store_batch(g, &k.data, &v.data, kv, ptrs, n, row_len, ring)
}
