use std::collections::HashMap;
use std::path::Path;

use kiln_quant::GgmlType;
use memmap2::Mmap;

use crate::error::{GgufError, Result};
use crate::value::{Value, ValueType};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal; a depth bound keeps recursion finite.
const MAX_NESTING: usize = 8;

enum Backing {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mmap(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// One tensor's header: name, ggml shape (ne0 first, the contiguous
/// dimension), type, and where its bytes are.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    pub n_elements: u64,
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Row length (ne0).
    pub fn row_len(&self) -> usize {
        self.dims.first().copied().unwrap_or(1) as usize
    }

    /// Number of rows (product of all dims but the first).
    pub fn n_rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        (self.row_len() / self.ty.block_elems()) * self.ty.block_bytes()
    }
}

/// A tensor whose bytes borrow the mapped file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    pub fn ty(&self) -> GgmlType {
        self.info.ty
    }

    pub fn dims(&self) -> &'a [u64] {
        &self.info.dims
    }

    /// The packed bytes of row `r` (rows are along ne0).
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.info.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// A parsed GGUF file.
pub struct Gguf {
    backing: Backing,
    version: u32,
    alignment: u64,
    data_start: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                offset: self.pos as u64,
                needed: n - self.remaining(),
                what,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count (v3: u64, v2: u64 too; v1 used u32 and is not supported).
    /// `min_item` is the least number of bytes each item takes, so a count
    /// that could not fit in the rest of the file is rejected before any
    /// allocation.
    fn count(&mut self, what: &'static str, min_item: u64) -> Result<u64> {
        let offset = self.pos as u64;
        let n = self.u64(what)?;
        if n.saturating_mul(min_item.max(1)) > self.remaining() {
            return Err(GgufError::CountTooLarge {
                what,
                count: n,
                offset,
            });
        }
        Ok(n)
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        let offset = self.pos as u64;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(GgufError::CountTooLarge {
                what: "string length",
                count: len,
                offset,
            });
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::BadUtf8 { offset })
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<Value> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>("u8 value")?[0]),
            ValueType::I8 => Value::I8(self.array::<1>("i8 value")?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array("u16 value")?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array("i16 value")?)),
            ValueType::U32 => Value::U32(self.u32("u32 value")?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array("i32 value")?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array("f32 value")?)),
            ValueType::U64 => Value::U64(self.u64("u64 value")?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array("i64 value")?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array("f64 value")?)),
            // ggml writes bools as one byte; any non-zero is true.
            ValueType::Bool => Value::Bool(self.array::<1>("bool value")?[0] != 0),
            ValueType::String => Value::String(self.string("string value")?),
            ValueType::Array => {
                let offset = self.pos as u64;
                if depth >= MAX_NESTING {
                    return Err(GgufError::NestingTooDeep {
                        max: MAX_NESTING,
                        offset,
                    });
                }
                let elem_ty = self.value_type()?;
                // Strings take at least their 8-byte length, arrays their
                // 4-byte type and 8-byte count.
                let min = elem_ty.scalar_size().unwrap_or(match elem_ty {
                    ValueType::String => 8,
                    _ => 12,
                });
                let n = self.count("array element", min)?;
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_ty, depth + 1)?);
                }
                Value::Array(elem_ty, items)
            }
        })
    }

    fn value_type(&mut self) -> Result<ValueType> {
        let offset = self.pos as u64;
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(GgufError::BadValueType { ty: id, offset })
    }
}

impl Gguf {
    /// Memory-map and parse a GGUF file.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only; like every mmap-based loader we
        // assume the file is not truncated by another process meanwhile.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::parse(Backing::Mmap(map))
    }

    /// Parse a GGUF image held in memory (tests, fuzzing, small files).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf> {
        Self::parse(Backing::Owned(bytes))
    }

    fn parse(backing: Backing) -> Result<Gguf> {
        let buf = backing.bytes();
        let mut c = Cursor { buf, pos: 0 };
        let magic: [u8; 4] = c.array("magic")?;
        if &magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::BadVersion(version));
        }
        // Each tensor info takes at least 8 (name len) + 4 + 8 + 4 + 8 bytes.
        let n_tensors = c.count("tensor", 32)?;
        // Each key-value takes at least 8 (key len) + 4 (type) + 1 bytes.
        let n_kv = c.count("metadata key-value", 13)?;

        let mut metadata = Vec::with_capacity(n_kv as usize);
        let mut meta_index = HashMap::with_capacity(n_kv as usize);
        for _ in 0..n_kv {
            let offset = c.pos as u64;
            let key = c.string("metadata key")?;
            let ty = c.value_type()?;
            let value = c.value(ty, 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(GgufError::DuplicateKey { key, offset });
            }
            metadata.push((key, value));
        }

        let alignment = match meta_index.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(&i) => {
                let a = metadata[i].1.as_u64().unwrap_or(0);
                if a == 0 || !a.is_power_of_two() {
                    return Err(GgufError::BadAlignment(a));
                }
                a
            }
        };

        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let info_offset = c.pos as u64;
            let name = c.string("tensor name")?;
            let dims_offset = c.pos as u64;
            let n_dims = c.u32("tensor dimension count")?;
            if n_dims > MAX_DIMS {
                return Err(GgufError::BadDims {
                    name,
                    n_dims,
                    offset: dims_offset,
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                dims.push(c.u64("tensor dimension")?);
            }
            let ty_offset = c.pos as u64;
            let ty_id = c.u32("tensor type")?;
            let ty = GgmlType::from_id(ty_id).ok_or_else(|| GgufError::BadTensorType {
                name: name.clone(),
                ty: ty_id,
                offset: ty_offset,
            })?;
            let offset = c.u64("tensor data offset")?;
            let n_elements = dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|_| dims.iter().all(|&d| d > 0))
                .ok_or_else(|| GgufError::DimsOverflow {
                    name: name.clone(),
                    dims: dims.clone(),
                    offset: dims_offset,
                })?;
            if dims.first().copied().unwrap_or(1) % ty.block_elems() as u64 != 0 {
                return Err(GgufError::NotWholeBlocks {
                    name,
                    ty: ty.name(),
                    elems: dims.first().copied().unwrap_or(1),
                    block: ty.block_elems(),
                });
            }
            let n_bytes = ty
                .bytes_for(n_elements)
                .ok_or_else(|| GgufError::DimsOverflow {
                    name: name.clone(),
                    dims: dims.clone(),
                    offset: dims_offset,
                })?;
            if offset % alignment != 0 {
                return Err(GgufError::Misaligned {
                    name,
                    offset,
                    alignment,
                });
            }
            if tensor_index.insert(name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor {
                    name,
                    offset: info_offset,
                });
            }
            tensors.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
                n_elements,
                n_bytes,
            });
        }

        let file_len = buf.len() as u64;
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        for t in &tensors {
            let start = data_start.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.n_bytes));
            match (start, end) {
                (Some(_), Some(end)) if end <= file_len => {}
                _ => {
                    return Err(GgufError::OutOfBounds {
                        name: t.name.clone(),
                        start: data_start.saturating_add(t.offset),
                        end: data_start.saturating_add(t.offset).saturating_add(t.n_bytes),
                        data_start,
                        file_len,
                    })
                }
            }
        }
        let mut order: Vec<&TensorInfo> = tensors.iter().collect();
        order.sort_by_key(|t| t.offset);
        for w in order.windows(2) {
            if w[0].offset + w[0].n_bytes > w[1].offset {
                return Err(GgufError::Overlap {
                    a: w[0].name.clone(),
                    b: w[1].name.clone(),
                    offset: data_start + w[1].offset,
                });
            }
        }

        Ok(Gguf {
            backing,
            version,
            alignment,
            data_start,
            metadata,
            meta_index,
            tensors,
            tensor_index,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// File offset where tensor data begins.
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    pub fn file_len(&self) -> u64 {
        self.backing.bytes().len() as u64
    }

    /// All metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn wrong(&self, key: &str, v: &Value, expected: &'static str) -> GgufError {
        GgufError::WrongType {
            key: key.to_string(),
            found: v.type_name(),
            expected,
        }
    }

    /// An unsigned integer key of any width that fits in u32.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        let v = self.require(key)?;
        v.as_u64()
            .and_then(|x| u32::try_from(x).ok())
            .ok_or_else(|| self.wrong(key, v, "u32"))
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self.require(key)?;
        v.as_u64().ok_or_else(|| self.wrong(key, v, "u64"))
    }

    /// A float key (f32/f64, or an integer).
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        let v = self.require(key)?;
        v.as_f64()
            .map(|x| x as f32)
            .ok_or_else(|| self.wrong(key, v, "f32"))
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self.require(key)?;
        v.as_bool().ok_or_else(|| self.wrong(key, v, "bool"))
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, v, "string"))
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong(key, v, "array"))
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let v = self.require(key)?;
        let arr = v.as_array().ok_or_else(|| self.wrong(key, v, "string array"))?;
        arr.iter()
            .map(|x| x.as_str().ok_or_else(|| self.wrong(key, v, "string array")))
            .collect()
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let v = self.require(key)?;
        let arr = v.as_array().ok_or_else(|| self.wrong(key, v, "float array"))?;
        arr.iter()
            .map(|x| {
                x.as_f64()
                    .map(|f| f as f32)
                    .ok_or_else(|| self.wrong(key, v, "float array"))
            })
            .collect()
    }

    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        let v = self.require(key)?;
        let arr = v.as_array().ok_or_else(|| self.wrong(key, v, "integer array"))?;
        arr.iter()
            .map(|x| x.as_i64().ok_or_else(|| self.wrong(key, v, "integer array")))
            .collect()
    }

    pub fn get_bool_array(&self, key: &str) -> Result<Vec<bool>> {
        let v = self.require(key)?;
        let arr = v.as_array().ok_or_else(|| self.wrong(key, v, "bool array"))?;
        arr.iter()
            .map(|x| x.as_bool().ok_or_else(|| self.wrong(key, v, "bool array")))
            .collect()
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// A view of a tensor's bytes, or None when the file has no such tensor.
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let info = self.tensor_info(name)?;
        let start = (self.data_start + info.offset) as usize;
        let data = &self.backing.bytes()[start..start + info.n_bytes as usize];
        Some(TensorView { info, data })
    }

    /// Like [`Gguf::tensor`], with an error naming the missing tensor.
    pub fn require_tensor(&self, name: &str) -> Result<TensorView<'_>> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }
}
