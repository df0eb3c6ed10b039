//! Streaming GGUF output: header first, then each tensor generated,
//! quantized and written chunk by chunk.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use kiln_gguf::write::GgufWriter;
use kiln_gguf::Value;
use kiln_quant::GgmlType;
use rayon::prelude::*;

use crate::plan::{Init, TensorPlan};
use crate::rng::Rng;
use crate::{io_err, metadata, plan, Result, SynthError, SynthReport, SynthSpec};

/// GGUF's default `general.alignment` (not written, so readers use 32).
const ALIGN: u64 = 32;

/// Elements generated per chunk (4 MiB of f32): large enough to amortize
/// rayon, small enough that a batch of them stays in the tens of MiB.
const CHUNK_ELEMS: usize = 1 << 20;

/// Where generation stands, passed to the progress callback after each
/// written batch.
#[derive(Clone, Debug)]
pub struct Progress<'a> {
    /// Tensor being written.
    pub tensor: &'a str,
    pub tensor_index: usize,
    pub n_tensors: usize,
    /// Tensor data bytes written so far / in the whole file.
    pub done_bytes: u64,
    pub total_bytes: u64,
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Header bytes (padded to the data section) and each tensor's offset
/// from the data start. The key-values are encoded by `GgufWriter` (given
/// no tensors, so nothing is buffered); the tensor infos, which need no
/// data, are appended here.
fn header(meta: Vec<(String, Value)>, tensors: &[TensorPlan]) -> Result<(Vec<u8>, Vec<u64>)> {
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.metadata(k, v);
    }
    let (bytes, layout) = w.to_bytes_with_layout()?;
    let mut h = bytes[..layout.tensor_infos_end as usize].to_vec();
    // Magic (4), version (4), then the tensor count.
    h[8..16].copy_from_slice(&(tensors.len() as u64).to_le_bytes());
    let mut offsets = Vec::with_capacity(tensors.len());
    let mut rel = 0u64;
    for t in tensors {
        offsets.push(rel);
        h.extend_from_slice(&(t.name.len() as u64).to_le_bytes());
        h.extend_from_slice(t.name.as_bytes());
        h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            h.extend_from_slice(&d.to_le_bytes());
        }
        h.extend_from_slice(&t.ty.id().to_le_bytes());
        h.extend_from_slice(&rel.to_le_bytes());
        rel = align(rel + t.n_bytes());
    }
    h.resize(align(h.len() as u64) as usize, 0);
    Ok((h, offsets))
}

/// Rows per chunk for a tensor (whole rows: quantization works per row).
fn chunk_rows(t: &TensorPlan) -> usize {
    (CHUNK_ELEMS / t.row_len()).clamp(1, t.n_rows())
}

/// Values and packed bytes of chunk `chunk` of tensor `index`.
fn gen_chunk(seed: u64, index: usize, t: &TensorPlan, chunk: usize) -> Result<Vec<u8>> {
    let rows = chunk_rows(t);
    let first = chunk * rows;
    let n_rows = rows.min(t.n_rows() - first);
    let mut x = vec![0.0f32; n_rows * t.row_len()];
    match t.init {
        Init::Normal { mean, std } => {
            Rng::new(seed, index as u64, chunk as u64).fill_normal(&mut x, mean, std)
        }
        Init::RopeFreqs { rotated } => {
            for (i, v) in x.iter_mut().enumerate() {
                *v = if i < rotated { 1.0 } else { 1e30 };
            }
        }
    }
    let n_bytes =
        t.ty.bytes_for(x.len() as u64)
            .expect("planned shapes are whole blocks") as usize;
    let mut out = vec![0u8; n_bytes];
    kiln_quant::quantize(t.ty, &x, &mut out).map_err(|source| SynthError::Quant {
        tensor: t.name.clone(),
        source,
    })?;
    Ok(out)
}

/// The `.part` file written before the rename, so an interrupted run never
/// leaves a truncated file under the final name; named for this writer
/// (process and call), so writers of the same file side by side (test
/// binaries on a GPU machine, parallel `kiln synth` runs) never write or
/// rename each other's.
fn part_path(out: &Path) -> PathBuf {
    static WRITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}-{n}.part", std::process::id()));
    out.with_file_name(name)
}

fn report(
    spec: &SynthSpec,
    out: &Path,
    tensors: &[TensorPlan],
    file_bytes: u64,
    start: Instant,
) -> Result<SynthReport> {
    let mut types: BTreeMap<&'static str, (usize, u64)> = BTreeMap::new();
    for t in tensors {
        let e = types.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes();
    }
    Ok(SynthReport {
        path: out.to_path_buf(),
        model: spec.preset()?.label(),
        quant: spec.quant,
        n_tensors: tensors.len(),
        n_params: tensors.iter().map(TensorPlan::n_elements).sum(),
        n_vocab: tensors
            .iter()
            .find(|t| t.name == "token_embd.weight")
            .map_or(0, |t| t.dims[1] as usize),
        file_bytes,
        types: types.into_iter().map(|(k, (n, b))| (k, n, b)).collect(),
        elapsed: start.elapsed(),
    })
}

/// Writes the random-weight model described by `spec` to `out`.
pub fn synthesize(spec: &SynthSpec, out: &Path) -> Result<SynthReport> {
    synthesize_with_progress(spec, out, &mut |_| {})
}

/// [`synthesize`], calling `progress` after every written batch (from the
/// calling thread).
pub fn synthesize_with_progress(
    spec: &SynthSpec,
    out: &Path,
    progress: &mut dyn FnMut(&Progress),
) -> Result<SynthReport> {
    let start = Instant::now();
    let tensors = plan(spec)?;
    let (head, offsets) = header(metadata(spec)?, &tensors)?;
    let part = part_path(out);
    let result = (|| {
        let mut f = File::create(&part).map_err(io_err(&part))?;
        f.write_all(&head).map_err(io_err(&part))?;
        let total_bytes: u64 = tensors.iter().map(TensorPlan::n_bytes).sum();
        let mut done_bytes = 0u64;
        // A few chunks per worker: enough to keep every core busy while the
        // batch in memory stays bounded.
        let batch = 2 * rayon::current_num_threads();
        let mut pos = 0u64;
        for (index, t) in tensors.iter().enumerate() {
            let pad = offsets[index] - pos;
            f.write_all(&vec![0u8; pad as usize])
                .map_err(io_err(&part))?;
            pos += pad;
            let n_chunks = t.n_rows().div_ceil(chunk_rows(t));
            for first in (0..n_chunks).step_by(batch) {
                let last = (first + batch).min(n_chunks);
                let bufs = (first..last)
                    .into_par_iter()
                    .map(|c| gen_chunk(spec.seed, index, t, c))
                    .collect::<Result<Vec<_>>>()?;
                for b in &bufs {
                    f.write_all(b).map_err(io_err(&part))?;
                    pos += b.len() as u64;
                    done_bytes += b.len() as u64;
                }
                progress(&Progress {
                    tensor: &t.name,
                    tensor_index: index,
                    n_tensors: tensors.len(),
                    done_bytes,
                    total_bytes,
                });
            }
        }
        let end = align(pos);
        f.write_all(&vec![0u8; (end - pos) as usize])
            .map_err(io_err(&part))?;
        f.sync_all().map_err(io_err(&part))?;
        Ok(head.len() as u64 + end)
    })();
    let file_bytes = match result {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_file(&part);
            return Err(e);
        }
    };
    std::fs::rename(&part, out).map_err(io_err(out))?;
    report(spec, out, &tensors, file_bytes, start)
}

/// Writes the same header as [`synthesize`] and the small F32 tensors
/// (norms, RoPE factors, scalars), but leaves every other tensor's data as
/// a hole: zeros, which are valid blocks of any type (all scales 0). On
/// filesystems with sparse files this takes almost no disk, so shape and
/// metadata checks of the 27B layout run in milliseconds.
pub fn write_skeleton(spec: &SynthSpec, out: &Path) -> Result<SynthReport> {
    let start = Instant::now();
    let tensors = plan(spec)?;
    let (head, offsets) = header(metadata(spec)?, &tensors)?;
    let mut f = File::create(out).map_err(io_err(out))?;
    f.write_all(&head).map_err(io_err(out))?;
    let data_start = head.len() as u64;
    for (index, t) in tensors.iter().enumerate() {
        if t.ty != GgmlType::F32 {
            continue;
        }
        f.seek(SeekFrom::Start(data_start + offsets[index]))
            .map_err(io_err(out))?;
        for c in 0..t.n_rows().div_ceil(chunk_rows(t)) {
            f.write_all(&gen_chunk(spec.seed, index, t, c)?)
                .map_err(io_err(out))?;
        }
    }
    let last = tensors.len() - 1;
    let file_bytes = data_start + align(offsets[last] + tensors[last].n_bytes());
    f.set_len(file_bytes).map_err(io_err(out))?;
    report(spec, out, &tensors, file_bytes, start)
}
