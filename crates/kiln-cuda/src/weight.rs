//! Weights uploaded once, still packed: the GGUF tensor's bytes as they are
//! in the file, row after row.

use std::sync::Arc;

use cudarc::driver::CudaSlice;
use kiln_gguf::Gguf;
use kiln_model::{ModelError, Result};
use kiln_quant::GgmlType;

use crate::gpu::{cuda_err, Gpu};

/// Types the CUDA kernels dequantize.
pub(crate) const SUPPORTED: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// A packed matrix on the device: `rows` rows of `row_bytes` bytes, each
/// `cols` values of type `ty`, exactly as in the GGUF file.
pub struct CudaWeight {
    pub(crate) data: CudaSlice<u8>,
    pub(crate) ty: GgmlType,
    pub(crate) cols: usize,
    pub(crate) rows: usize,
    pub(crate) row_bytes: usize,
    pub(crate) name: String,
}

impl std::fmt::Debug for CudaWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaWeight")
            .field("name", &self.name)
            .field("ty", &self.ty)
            .field("cols", &self.cols)
            .field("rows", &self.rows)
            .finish()
    }
}

/// Checks the tensor `name` and copies its packed bytes to the device.
pub(crate) fn upload(gpu: &Gpu, gguf: &Arc<Gguf>, name: &str) -> Result<CudaWeight> {
    let bad = |reason: String| ModelError::BadTensor {
        name: name.to_string(),
        reason,
    };
    let info = gguf
        .tensor_info(name)
        .ok_or_else(|| ModelError::MissingTensor {
            name: name.to_string(),
        })?;
    if !SUPPORTED.contains(&info.ty) {
        return Err(bad(format!("type {} has no CUDA kernel", info.ty)));
    }
    if info.dims.is_empty() || info.dims.len() > 3 {
        return Err(bad(format!(
            "shape {:?} is not a 2-D or 3-D matrix",
            info.dims
        )));
    }
    let cols = info.row_len();
    if cols % info.ty.block_elems() != 0 {
        return Err(bad(format!(
            "row length {cols} is not a multiple of the {} block size {}",
            info.ty,
            info.ty.block_elems()
        )));
    }
    let (rows, row_bytes) = (info.n_rows(), info.row_bytes());
    let bytes = gguf.require_tensor(name).map_err(ModelError::from)?.data;
    if bytes.len() != rows * row_bytes {
        return Err(bad(format!(
            "{} bytes of data for {rows} rows of {row_bytes} bytes",
            bytes.len()
        )));
    }
    let mut data = gpu.alloc::<u8>(bytes.len(), name)?;
    gpu.stream
        .memcpy_htod(bytes, &mut data)
        .map_err(|e| cuda_err(&format!("uploading {name}"), e))?;
    Ok(CudaWeight {
        data,
        ty: info.ty,
        cols,
        rows,
        row_bytes,
        name: name.to_string(),
    })
}

/// One matrix of `parts`' rows in order (a device-to-device copy), when
/// they share type and row length; `None` otherwise. Lets one matmul
/// launch do the work of several (q/k/v, gate/up).
pub(crate) fn concat(gpu: &Gpu, parts: &[&CudaWeight]) -> Result<Option<CudaWeight>> {
    let Some(first) = parts.first() else {
        return Ok(None);
    };
    let same = |w: &&CudaWeight| w.ty == first.ty && w.cols == first.cols;
    if parts.len() < 2 || !parts.iter().all(same) {
        return Ok(None);
    }
    let rows: usize = parts.iter().map(|w| w.rows).sum();
    let name = parts
        .iter()
        .map(|w| w.name.as_str())
        .collect::<Vec<_>>()
        .join("+");
    let mut data = gpu.alloc::<u8>(rows * first.row_bytes, &name)?;
    let mut at = 0;
    for w in parts {
        let len = w.rows * w.row_bytes;
        if w.data.len() < len {
            return Err(ModelError::Backend(format!(
                "{}: {} bytes on the device for {} rows of {}",
                w.name,
                w.data.len(),
                w.rows,
                w.row_bytes
            )));
        }
        gpu.stream
            .memcpy_dtod(&w.data.slice(..len), &mut data.slice_mut(at..at + len))
            .map_err(|e| cuda_err(&format!("joining {name}"), e))?;
        at += len;
    }
    Ok(Some(CudaWeight {
        data,
        ty: first.ty,
        cols: first.cols,
        rows,
        row_bytes: first.row_bytes,
        name,
    }))
}
