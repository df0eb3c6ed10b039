//! A small GGUF writer: metadata and tensors in, file bytes out.
//!
//! It writes what gguf-py and llama.cpp write (v3 by default, the data
//! section and every tensor's data padded to `general.alignment`, default
//! 32), so a parsed file re-written by [`GgufWriter::from_gguf`] comes out
//! byte for byte the same. Tests use it for synthetic models and, through
//! [`Layout`], to find the byte offset of every section they corrupt.
//!
//! ```
//! use kiln_gguf::{write::GgufWriter, Gguf, GgmlType, Value};
//!
//! let mut w = GgufWriter::new();
//! w.metadata("general.architecture", Value::String("gemma3".into()));
//! let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|x| x.to_le_bytes()).collect();
//! w.tensor("t", &[2], GgmlType::F32, data).unwrap();
//! let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
//! assert_eq!(g.architecture().unwrap(), "gemma3");
//! assert_eq!(g.tensor("t").unwrap().data.len(), 8);
//! ```

use std::borrow::Cow;

use kiln_quant::GgmlType;

use crate::reader::Gguf;
use crate::value::Value;

const DEFAULT_ALIGNMENT: u64 = 32;

/// Why a writer refused to produce a file (it never writes one the reader
/// would reject, except for duplicate metadata keys, which tests need, and
/// arrays nested deeper than the reader's limit).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("GGUF version {0} cannot be written (2 or 3)")]
    Version(u32),
    #[error("general.alignment {0} is not a power of two in u32")]
    Alignment(String),
    #[error("tensor {name:?}: {n_dims} dimensions (1 to 4)")]
    Dims { name: String, n_dims: usize },
    #[error(
        "tensor {name:?}: dimensions {dims:?} are zero, overflow or are not whole {ty} blocks"
    )]
    Shape {
        name: String,
        dims: Vec<u64>,
        ty: &'static str,
    },
    #[error("tensor {name:?}: {got} data bytes, shape and type need {expected}")]
    DataLen {
        name: String,
        got: usize,
        expected: u64,
    },
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("cannot split {tensors} tensors into {parts} parts (1 to min(tensors, 65535))")]
    Split { tensors: usize, parts: usize },
}

/// Where each part of a written file starts (byte offsets from the start
/// of the file).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Layout {
    /// Start of each key-value (its key length).
    pub kv: Vec<u64>,
    /// Start of each key-value's value (after the 4-byte type id).
    pub kv_value: Vec<u64>,
    /// Start of each tensor info (its name length).
    pub tensor_info: Vec<u64>,
    /// End of the last tensor info, before the alignment padding.
    pub tensor_infos_end: u64,
    /// Start of the data section.
    pub data_start: u64,
    /// Absolute start of each tensor's data.
    pub tensor_data: Vec<u64>,
    /// Total file length.
    pub len: u64,
}

struct PendingTensor<'a> {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Cow<'a, [u8]>,
}

/// Builds a GGUF file. Metadata keys keep insertion order.
#[derive(Default)]
pub struct GgufWriter<'a> {
    version: Option<u32>,
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor<'a>>,
}

impl<'a> GgufWriter<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Copies every key-value and tensor of `g` (tensor data borrowed).
    pub fn from_gguf(g: &'a Gguf) -> Self {
        let mut w = GgufWriter {
            version: Some(g.version()),
            metadata: g.metadata().to_vec(),
            tensors: Vec::with_capacity(g.tensor_infos().len()),
        };
        for t in g.tensor_infos() {
            let view = g
                .tensor(&t.name)
                .expect("tensor listed by tensor_infos exists in the same file");
            w.tensors.push(PendingTensor {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ty: t.ty,
                data: Cow::Borrowed(view.data),
            });
        }
        w
    }

    /// The GGUF version to write (2 or 3: the same layout); default 3.
    pub fn version(&mut self, v: u32) -> &mut Self {
        self.version = Some(v);
        self
    }

    /// Appends a key-value. Duplicates are written as given (the reader
    /// rejects them; tests rely on being able to make one).
    pub fn metadata(&mut self, key: impl Into<String>, value: Value) -> &mut Self {
        self.metadata.push((key.into(), value));
        self
    }

    /// Sets `general.alignment` (u32), replacing an existing value in place.
    pub fn alignment(&mut self, a: u32) -> &mut Self {
        let v = Value::U32(a);
        match self
            .metadata
            .iter_mut()
            .find(|(k, _)| k == "general.alignment")
        {
            Some(kv) => kv.1 = v,
            None => self.metadata.push(("general.alignment".into(), v)),
        }
        self
    }

    /// The keys in the order they will be written.
    pub fn metadata_keys(&self) -> impl Iterator<Item = &str> {
        self.metadata.iter().map(|(k, _)| k.as_str())
    }

    /// Removes every key-value named `key`.
    pub fn remove_metadata(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self
    }

    /// Appends a tensor; `dims` in ggml order (row length first) and `data`
    /// exactly the packed bytes the type and shape call for.
    pub fn tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        data: impl Into<Cow<'a, [u8]>>,
    ) -> Result<&mut Self, WriteError> {
        let name = name.into();
        let data = data.into();
        if dims.is_empty() || dims.len() > 4 {
            return Err(WriteError::Dims {
                name,
                n_dims: dims.len(),
            });
        }
        let n_bytes = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| {
                n > 0 && n <= i64::MAX as u64 && dims[0].is_multiple_of(ty.block_elems() as u64)
            })
            .and_then(|n| ty.bytes_for(n));
        let Some(n_bytes) = n_bytes else {
            return Err(WriteError::Shape {
                name,
                dims: dims.to_vec(),
                ty: ty.name(),
            });
        };
        if data.len() as u64 != n_bytes {
            return Err(WriteError::DataLen {
                name,
                got: data.len(),
                expected: n_bytes,
            });
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(WriteError::DuplicateTensor(name));
        }
        self.tensors.push(PendingTensor {
            name,
            dims: dims.to_vec(),
            ty,
            data,
        });
        Ok(self)
    }

    /// The effective alignment: `general.alignment` if set, else 32.
    fn effective_alignment(&self) -> Result<u64, WriteError> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, v)) => v
                .as_u64()
                .filter(|a| a.is_power_of_two() && *a <= u32::MAX as u64)
                .ok_or_else(|| WriteError::Alignment(v.to_string())),
        }
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>, WriteError> {
        self.to_bytes_with_layout().map(|(b, _)| b)
    }

    /// The file and where each of its parts starts.
    pub fn to_bytes_with_layout(&self) -> Result<(Vec<u8>, Layout), WriteError> {
        let version = self.version.unwrap_or(3);
        if !(2..=3).contains(&version) {
            return Err(WriteError::Version(version));
        }
        let alignment = self.effective_alignment()?;
        let mut out = Vec::new();
        let mut layout = Layout::default();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, v) in &self.metadata {
            layout.kv.push(out.len() as u64);
            put_str(&mut out, key);
            out.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            layout.kv_value.push(out.len() as u64);
            put_value(&mut out, v);
        }
        // Tensor data offsets: each tensor padded to the alignment.
        let mut rel = 0u64;
        let mut rel_offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            rel_offsets.push(rel);
            rel = (rel + t.data.len() as u64).div_ceil(alignment) * alignment;
        }
        for (t, &off) in self.tensors.iter().zip(&rel_offsets) {
            layout.tensor_info.push(out.len() as u64);
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
        }
        layout.tensor_infos_end = out.len() as u64;
        pad_to(&mut out, alignment);
        layout.data_start = out.len() as u64;
        for t in &self.tensors {
            layout.tensor_data.push(out.len() as u64);
            out.extend_from_slice(&t.data);
            pad_to(&mut out, alignment);
        }
        layout.len = out.len() as u64;
        Ok((out, layout))
    }
}

impl GgufWriter<'_> {
    /// The file split into `n` parts as llama.cpp's gguf-split writes one:
    /// consecutive runs of about equal tensor counts; the first part holds
    /// all metadata, every part `split.no` (u16, 0-based), `split.count`
    /// (u16) and `split.tensors.count` (i32). Name part `i` with
    /// [`crate::split_file_name`] so that [`Gguf::open`] finds them all.
    pub fn to_split_bytes(&self, n: usize) -> Result<Vec<Vec<u8>>, WriteError> {
        let total = self.tensors.len();
        if n == 0 || n > total || n > u16::MAX as usize || total > i32::MAX as usize {
            return Err(WriteError::Split {
                tensors: total,
                parts: n,
            });
        }
        let alignment = self.effective_alignment()?;
        (0..n)
            .map(|no| {
                let mut w = GgufWriter {
                    version: self.version,
                    metadata: if no == 0 {
                        self.metadata.clone()
                    } else {
                        vec![("general.alignment".into(), Value::U32(alignment as u32))]
                    },
                    tensors: Vec::new(),
                };
                w.metadata(crate::split::KEY_NO, Value::U16(no as u16))
                    .metadata(crate::split::KEY_COUNT, Value::U16(n as u16))
                    .metadata(crate::split::KEY_TENSORS, Value::I32(total as i32));
                for t in &self.tensors[no * total / n..(no + 1) * total / n] {
                    w.tensors.push(PendingTensor {
                        name: t.name.clone(),
                        dims: t.dims.clone(),
                        ty: t.ty,
                        data: Cow::Borrowed(&t.data),
                    });
                }
                w.to_bytes()
            })
            .collect()
    }
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = (out.len() as u64).div_ceil(alignment) * alignment;
    out.resize(len as usize, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => a.encode(out),
    }
}
