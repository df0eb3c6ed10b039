use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use kiln_quant::GgmlType;
use memmap2::Mmap;

use crate::error::{GgufError, Result};
use crate::value::{Array, Elem, FileSlice, Scalars, StringArray, Value, ValueType};

const MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's GGML_MAX_DIMS.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal; a depth bound keeps recursion finite.
const MAX_NESTING: usize = 8;

/// The file's bytes, shared by the parsed file and the metadata arrays
/// that point into it.
pub(crate) enum Backing {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

impl Backing {
    pub(crate) fn bytes(&self) -> &[u8] {
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
    ///
    /// # Panics
    /// When `r >= info.n_rows()`: a caller's bug, never the file's (every
    /// view's bytes were checked to hold all its rows).
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.info.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}

/// One file of a model: its bytes and where its data section starts.
pub(crate) struct Part {
    pub(crate) backing: Arc<Backing>,
    pub(crate) data_start: u64,
}

/// A parsed GGUF model: one file, or the parts of a split model joined
/// (metadata from the first part, tensors from all; see `split.rs`).
pub struct Gguf {
    pub(crate) parts: Vec<Part>,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, Value)>,
    meta_index: HashMap<String, usize>,
    pub(crate) tensors: Vec<TensorInfo>,
    pub(crate) tensor_index: HashMap<String, usize>,
    /// The index in `parts` of each tensor's file.
    pub(crate) tensor_part: Vec<usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("parts", &self.parts.len())
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// What `buf` is, for arrays that stay encoded in it.
    file: &'a Arc<Backing>,
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

    /// A count (u64 in v2 and v3; v1 used u32 and is not supported).
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

    /// A length-prefixed UTF-8 string, borrowed from the file.
    fn str(&mut self, what: &'static str) -> Result<&'a str> {
        let offset = self.pos as u64;
        let len = self.u64(what)?;
        if len > self.remaining() {
            return Err(GgufError::StringTooLong { what, len, offset });
        }
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::BadUtf8 { offset })
    }

    fn string(&mut self, what: &'static str) -> Result<String> {
        self.str(what).map(str::to_string)
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
            ValueType::Array => Value::Array(self.array_value(depth)?),
        })
    }

    /// An array (element type, count, elements) into its typed form.
    fn array_value(&mut self, depth: usize) -> Result<Array> {
        let offset = self.pos as u64;
        if depth >= MAX_NESTING {
            return Err(GgufError::NestingTooDeep {
                max: MAX_NESTING,
                offset,
            });
        }
        let elem_ty = self.value_type()?;
        // Strings take at least their 8-byte length, arrays their 4-byte
        // type and 8-byte count.
        let min = elem_ty.scalar_size().unwrap_or(match elem_ty {
            ValueType::String => 8,
            _ => 12,
        });
        let n = self.count("array element count", min)?;
        // Fixed-size elements stay in the file (the count check above
        // guarantees their bytes).
        macro_rules! scalars {
            ($variant:ident, $t:ty, $what:literal) => {{
                let len = n as usize * <$t as Elem>::SIZE;
                let slice = self.slice(len as u64, $what)?;
                Array::$variant(Scalars::from_file(slice))
            }};
        }
        Ok(match elem_ty {
            ValueType::U8 => scalars!(U8, u8, "u8 value"),
            ValueType::I8 => scalars!(I8, i8, "i8 value"),
            ValueType::U16 => scalars!(U16, u16, "u16 value"),
            ValueType::I16 => scalars!(I16, i16, "i16 value"),
            ValueType::U32 => scalars!(U32, u32, "u32 value"),
            ValueType::I32 => scalars!(I32, i32, "i32 value"),
            ValueType::F32 => scalars!(F32, f32, "f32 value"),
            ValueType::U64 => scalars!(U64, u64, "u64 value"),
            ValueType::I64 => scalars!(I64, i64, "i64 value"),
            ValueType::F64 => scalars!(F64, f64, "f64 value"),
            ValueType::Bool => scalars!(Bool, bool, "bool value"),
            ValueType::String => self.strings(n)?,
            ValueType::Array => {
                let cap = bounded_capacity::<Array>(n, self.remaining());
                let mut items = Vec::with_capacity(cap);
                for _ in 0..n {
                    items.push(self.array_value(depth + 1)?);
                }
                Array::Array(items)
            }
        })
    }

    /// The next `len` bytes as a slice of the shared file.
    fn slice(&mut self, len: u64, what: &'static str) -> Result<FileSlice> {
        let start = self.pos;
        self.take(len, what)?;
        Ok(FileSlice {
            file: self.file.clone(),
            start,
            len: len as usize,
        })
    }

    /// `n` strings, validated and left in the file with their end offsets
    /// (a vocabulary's text is megabytes: it is not copied). Strings
    /// spanning 4 GiB or more, which u32 offsets cannot address, are
    /// copied instead.
    fn strings(&mut self, n: u64) -> Result<Array> {
        let start = self.pos;
        let mut ends = Vec::with_capacity(n as usize);
        for _ in 0..n {
            self.str("string value")?;
            ends.extend(u32::try_from(self.pos - start).ok());
        }
        if ends.len() as u64 == n {
            let len = self.pos - start;
            let slice = FileSlice {
                file: self.file.clone(),
                start,
                len,
            };
            return Ok(Array::String(StringArray::from_file(slice, ends.into())));
        }
        drop(ends);
        let end = self.pos;
        self.pos = start;
        let mut a = StringArray::with_capacity(n as usize, end - start);
        for _ in 0..n {
            a.push(self.str("string value")?);
        }
        Ok(Array::String(a))
    }

    fn value_type(&mut self) -> Result<ValueType> {
        let offset = self.pos as u64;
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(GgufError::BadValueType { ty: id, offset })
    }
}

/// Least bytes a tensor info takes: name length (8), n_dims (4, may be 0),
/// type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;
/// Least bytes a key-value takes: key length (8), type (4), a 1-byte value.
const MIN_KV_BYTES: u64 = 13;
/// ggml keeps element counts in int64.
const MAX_ELEMENTS: u64 = i64::MAX as u64;

/// How many `T`s to reserve for `n` items read from the file: never more
/// than the bytes left in the file could hold, so that a lying count costs
/// no allocation larger than the file (the vector still grows as real items
/// are parsed, each of which consumes file bytes).
fn bounded_capacity<T>(n: u64, remaining: u64) -> usize {
    let fit = remaining / std::mem::size_of::<T>().max(1) as u64;
    n.min(fit) as usize
}

type Metadata = (
    Vec<(String, Value)>,
    HashMap<String, usize>,
    Option<(usize, u64)>,
);

/// Reads `n_kv` key-values; also returns where `general.alignment` is
/// (index, file offset of its value) when present.
fn parse_metadata(c: &mut Cursor<'_>, n_kv: u64) -> Result<Metadata> {
    let cap = bounded_capacity::<(String, Value)>(n_kv, c.remaining());
    let mut metadata = Vec::with_capacity(cap);
    let mut index = HashMap::with_capacity(cap);
    let mut alignment_at = None;
    for _ in 0..n_kv {
        let offset = c.pos as u64;
        let key = c.string("metadata key")?;
        let ty = c.value_type()?;
        let value_offset = c.pos as u64;
        let value = c.value(ty, 0)?;
        if index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey { key, offset });
        }
        if key == "general.alignment" {
            alignment_at = Some((metadata.len(), value_offset));
        }
        metadata.push((key, value));
    }
    Ok((metadata, index, alignment_at))
}

/// Reads and validates one tensor info (everything but its data range,
/// which needs the data section start).
fn parse_tensor_info(c: &mut Cursor<'_>, alignment: u64) -> Result<TensorInfo> {
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
    let Some(ty) = GgmlType::from_id(ty_id) else {
        return Err(GgufError::BadTensorType {
            name,
            ty: ty_id,
            offset: ty_offset,
        });
    };
    let offset = c.u64("tensor data offset")?;
    // ggml cannot represent an empty tensor (llama.cpp divides by each dim).
    if dims.contains(&0) {
        return Err(GgufError::ZeroDim {
            name,
            dims,
            offset: dims_offset,
        });
    }
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= MAX_ELEMENTS);
    let row_len = dims.first().copied().unwrap_or(1);
    if n_elements.is_some() && !row_len.is_multiple_of(ty.block_elems() as u64) {
        return Err(GgufError::NotWholeBlocks {
            name,
            ty: ty.name(),
            elems: row_len,
            block: ty.block_elems(),
            offset: dims_offset,
        });
    }
    let Some((n_elements, n_bytes)) = n_elements.and_then(|n| Some((n, ty.bytes_for(n)?))) else {
        return Err(GgufError::DimsOverflow {
            name,
            dims,
            offset: dims_offset,
        });
    };
    if !offset.is_multiple_of(alignment) {
        return Err(GgufError::Misaligned {
            name,
            offset,
            alignment,
            info_offset,
        });
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset,
        n_elements,
        n_bytes,
    })
}

/// Every tensor's bytes must lie inside the file, after `data_start`, and
/// no two may share a byte.
fn check_data_section(tensors: &[TensorInfo], data_start: u64, file_len: u64) -> Result<()> {
    for t in tensors {
        let start = data_start.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        if !matches!(end, Some(end) if end <= file_len) {
            return Err(GgufError::OutOfBounds {
                name: t.name.clone(),
                start: data_start.saturating_add(t.offset),
                end: data_start
                    .saturating_add(t.offset)
                    .saturating_add(t.n_bytes),
                data_start,
                file_len,
            });
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().collect();
    order.sort_by_key(|t| t.offset);
    for w in order.windows(2) {
        // In bounds (checked above), so these sums cannot overflow.
        if w[0].offset + w[0].n_bytes > w[1].offset {
            return Err(GgufError::Overlap {
                a: w[0].name.clone(),
                b: w[1].name.clone(),
                offset: data_start + w[1].offset,
            });
        }
    }
    Ok(())
}

impl Gguf {
    /// Memory-map and parse a GGUF file. The first part of a split model
    /// (`NAME-00001-of-0000N.gguf`, as llama.cpp's gguf-split writes) opens
    /// every part beside it as one model.
    pub fn open(path: impl AsRef<Path>) -> Result<Gguf> {
        let path = path.as_ref();
        crate::split::join(Self::open_file(path)?, path)
    }

    /// Memory-map and parse one file (a split model's part stays a part).
    pub(crate) fn open_file(path: &Path) -> Result<Gguf> {
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
        let backing = Arc::new(backing);
        let buf = backing.bytes();
        let mut c = Cursor {
            buf,
            pos: 0,
            file: &backing,
        };
        let magic: [u8; 4] = c.array("magic")?;
        if &magic != MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        // v2 and v3 share one layout (v3 only allowed big-endian files,
        // which announce themselves here as version 0x0300_0000).
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::BadVersion(version));
        }
        let n_tensors = c.count("tensor count", MIN_TENSOR_INFO_BYTES)?;
        let n_kv = c.count("metadata key-value count", MIN_KV_BYTES)?;

        let (metadata, meta_index, alignment_at) = parse_metadata(&mut c, n_kv)?;
        let alignment = match alignment_at {
            None => DEFAULT_ALIGNMENT,
            Some((i, offset)) => {
                let v = &metadata[i].1;
                match v.as_u64() {
                    Some(a) if a.is_power_of_two() => a,
                    _ => {
                        return Err(GgufError::BadAlignment {
                            found: v.to_string(),
                            offset,
                        })
                    }
                }
            }
        };

        let cap = bounded_capacity::<TensorInfo>(n_tensors, c.remaining());
        let mut tensors = Vec::with_capacity(cap);
        let mut tensor_index = HashMap::with_capacity(cap);
        for _ in 0..n_tensors {
            let info_offset = c.pos as u64;
            let t = parse_tensor_info(&mut c, alignment)?;
            if tensor_index.insert(t.name.clone(), tensors.len()).is_some() {
                return Err(GgufError::DuplicateTensor {
                    name: t.name,
                    offset: info_offset,
                });
            }
            tensors.push(t);
        }

        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        check_data_section(&tensors, data_start, buf.len() as u64)?;

        Ok(Gguf {
            parts: vec![Part {
                backing,
                data_start,
            }],
            version,
            alignment,
            metadata,
            meta_index,
            tensor_part: vec![0; tensors.len()],
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

    /// File offset where tensor data begins (in the first part).
    pub fn data_start(&self) -> u64 {
        self.parts[0].data_start
    }

    /// Bytes of the file, or of all parts of a split model.
    pub fn file_len(&self) -> u64 {
        self.parts
            .iter()
            .map(|p| p.backing.bytes().len() as u64)
            .sum()
    }

    /// How many files the model was read from (1 unless split).
    pub fn n_parts(&self) -> usize {
        self.parts.len()
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

    pub fn get_array(&self, key: &str) -> Result<&Array> {
        let v = self.require(key)?;
        v.as_array().ok_or_else(|| self.wrong(key, v, "array"))
    }

    /// A string array (borrowed: one text buffer, no copy per string).
    /// An empty array of another type counts as an empty string array.
    pub fn get_str_array(&self, key: &str) -> Result<&StringArray> {
        static EMPTY: StringArray = StringArray::new();
        let v = self.require(key)?;
        match v.as_array() {
            Some(Array::String(s)) => Ok(s),
            Some(a) if a.is_empty() => Ok(&EMPTY),
            _ => Err(self.wrong(key, v, "string array")),
        }
    }

    /// An array of any numeric type, as f32.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let v = self.require(key)?;
        let wrong = || self.wrong(key, v, "float array");
        match v.as_array().ok_or_else(wrong)? {
            Array::F32(x) => Ok(x.to_vec()),
            arr => arr
                .iter()
                .map(|x| x.as_f64().map(|f| f as f32).ok_or_else(wrong))
                .collect(),
        }
    }

    /// An array of any integer type whose values fit in i64.
    pub fn get_i64_array(&self, key: &str) -> Result<Vec<i64>> {
        let v = self.require(key)?;
        let wrong = || self.wrong(key, v, "integer array");
        let arr = v.as_array().ok_or_else(wrong)?;
        arr.iter().map(|x| x.as_i64().ok_or_else(wrong)).collect()
    }

    pub fn get_bool_array(&self, key: &str) -> Result<Vec<bool>> {
        let v = self.require(key)?;
        let wrong = || self.wrong(key, v, "bool array");
        let arr = v.as_array().ok_or_else(wrong)?;
        arr.iter().map(|x| x.as_bool().ok_or_else(wrong)).collect()
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
        let i = *self.tensor_index.get(name)?;
        let info = &self.tensors[i];
        let part = &self.parts[self.tensor_part[i]];
        let start = (part.data_start + info.offset) as usize;
        let data = &part.backing.bytes()[start..start + info.n_bytes as usize];
        Some(TensorView { info, data })
    }

    /// Hands the resident pages of tensor `name` back to the OS, for a
    /// caller that keeps its own copy of the bytes (the CPU backend's
    /// repacked weights) and will not read them again soon: the process's
    /// RSS drops by their size and a later read faults the same bytes back
    /// in from the file. Only whole 64 KiB spans inside the tensor are
    /// released (a neighbour's bytes stay resident). `false` where nothing
    /// was released: no such tensor, a file held in memory, the call
    /// refused.
    pub fn release_pages(&self, name: &str) -> bool {
        let Some(&i) = self.tensor_index.get(name) else {
            return false;
        };
        self.release_range(name, 0..self.tensors[i].n_bytes as usize)
    }

    /// [`Gguf::release_pages`] for bytes `range` of tensor `name` only (a
    /// caller that copies a tensor piece by piece hands each piece back
    /// as it goes, so the two copies are never resident together).
    pub fn release_range(&self, name: &str, range: std::ops::Range<usize>) -> bool {
        const SPAN: usize = 64 << 10;
        let Some(&i) = self.tensor_index.get(name) else {
            return false;
        };
        let info = &self.tensors[i];
        let part = &self.parts[self.tensor_part[i]];
        let Backing::Mmap(map) = &*part.backing else {
            return false;
        };
        let start = (part.data_start + info.offset) as usize;
        let end = range.end.min(info.n_bytes as usize);
        let (a, b) = (
            (start + range.start).next_multiple_of(SPAN),
            (start + end) / SPAN * SPAN,
        );
        if b <= a {
            return false;
        }
        #[cfg(unix)]
        {
            // SAFETY: the map is read-only and private and nothing ever
            // writes it, so MADV_DONTNEED only drops this process's
            // references to clean file pages: every borrow of these bytes
            // reads the same file contents after the call (faulted back in
            // on access). The range lies inside the map.
            let r =
                unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, a, b - a) };
            r.is_ok()
        }
        #[cfg(not(unix))]
        {
            let _ = map;
            false
        }
    }

    /// Like [`Gguf::tensor`], with an error naming the missing tensor.
    pub fn require_tensor(&self, name: &str) -> Result<TensorView<'_>> {
        self.tensor(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_never_exceed_the_bytes_left() {
        let value = std::mem::size_of::<Value>() as u64;
        assert_eq!(bounded_capacity::<Value>(10, 1 << 20), 10);
        assert_eq!(
            bounded_capacity::<Value>(u64::MAX, 1000),
            (1000 / value) as usize
        );
        assert_eq!(bounded_capacity::<Value>(u64::MAX, 0), 0);
        assert_eq!(bounded_capacity::<()>(7, 3), 3);
    }

    /// A u8 array whose count matches the bytes left is legal, and parses
    /// to exactly that many items.
    #[test]
    fn array_count_equal_to_the_bytes_left_parses() {
        let mut b = Vec::new();
        b.extend_from_slice(b"GGUF");
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.extend_from_slice(&1u64.to_le_bytes());
        b.push(b'a');
        b.extend_from_slice(&(ValueType::Array as u32).to_le_bytes());
        b.extend_from_slice(&(ValueType::U8 as u32).to_le_bytes());
        b.extend_from_slice(&1000u64.to_le_bytes());
        b.extend(std::iter::repeat_n(7u8, 1000));
        let g = Gguf::from_bytes(b.clone()).unwrap();
        assert_eq!(g.get_array("a").unwrap().len(), 1000);
        b.pop();
        let e = Gguf::from_bytes(b).unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::CountTooLarge {
                    count: 1000,
                    offset: 41,
                    ..
                }
            ),
            "{e:?}"
        );
    }
}
