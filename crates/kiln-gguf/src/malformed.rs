//! Malformed variants of a valid GGUF image, each with the error the reader
//! must give for it: truncations at every section boundary and inside
//! values and tensor data, and corrupted counts, lengths, types, shapes,
//! offsets and alignments. The reader's tests, the `kiln` CLI's tests and the
//! fuzz corpus seeds all use the same list.

use crate::error::GgufError;
use crate::reader::Gguf;
use crate::value::{Array, Value};
use crate::write::{GgufWriter, Layout, WriteError};

/// Checks that an error is the one a variant must produce.
pub type Expect = Box<dyn Fn(&GgufError) -> bool + Send + Sync>;

/// One malformed file.
pub struct Malformed {
    /// What was done to the file (unique within a list; usable in a file name).
    pub name: String,
    pub bytes: Vec<u8>,
    /// The error variant it must produce, for messages.
    pub expect_name: &'static str,
    pub expect: Expect,
}

impl std::fmt::Debug for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Malformed")
            .field("name", &self.name)
            .field("len", &self.bytes.len())
            .field("expect", &self.expect_name)
            .finish()
    }
}

/// Why variants could not be made from a file.
#[derive(Debug, thiserror::Error)]
pub enum VariantsError {
    #[error("the base file does not parse: {0}")]
    Parse(#[from] GgufError),
    #[error("the base file cannot be re-written: {0}")]
    Write(#[from] WriteError),
}

macro_rules! expect {
    ($name:literal, $pat:pat $(if $guard:expr)?) => {
        ($name, Box::new(move |e: &GgufError| matches!(e, $pat $(if $guard)?)) as Expect)
    };
}

/// Malformed variants of `valid` (a GGUF image that must parse). The base
/// they corrupt is `valid` re-written by [`GgufWriter`], which for files
/// written by gguf-py or llama.cpp is the same bytes. Variants that need a
/// feature the file lacks (two tensors with names of equal length, a string
/// array, …) are left out.
pub fn variants(valid: &[u8]) -> Result<Vec<Malformed>, VariantsError> {
    let g = Gguf::from_bytes(valid.to_vec())?;
    let (base, l) = GgufWriter::from_gguf(&g).to_bytes_with_layout()?;
    let mut v = Variants {
        base: &base,
        out: Vec::new(),
    };
    v.truncations(&g, &l);
    v.header();
    v.metadata(&g, &l);
    v.tensor_infos(&g, &l);
    v.rewritten(&g)?;
    Ok(v.out)
}

struct Variants<'b> {
    base: &'b [u8],
    out: Vec<Malformed>,
}

/// Byte offsets of the fields of one tensor info.
struct InfoFields {
    name: u64,
    name_len: u64,
    n_dims: u64,
    dims: u64,
    ty: u64,
    offset: u64,
}

fn info_fields(g: &Gguf, l: &Layout, i: usize) -> InfoFields {
    let t = &g.tensor_infos()[i];
    let start = l.tensor_info[i];
    let name_len = t.name.len() as u64;
    let n_dims = start + 8 + name_len;
    let ty = n_dims + 4 + 8 * t.dims.len() as u64;
    InfoFields {
        name: start + 8,
        name_len: start,
        n_dims,
        dims: n_dims + 4,
        ty,
        offset: ty + 4,
    }
}

impl Variants<'_> {
    fn push(
        &mut self,
        name: String,
        bytes: Vec<u8>,
        (expect_name, expect): (&'static str, Expect),
    ) {
        self.out.push(Malformed {
            name,
            bytes,
            expect_name,
            expect,
        });
    }

    fn patch(&self, at: u64, with: &[u8]) -> Vec<u8> {
        let mut b = self.base.to_vec();
        b[at as usize..at as usize + with.len()].copy_from_slice(with);
        b
    }

    /// The file cut to `at` bytes. Where a count read before the cut claims
    /// more items than the bytes left could hold, the reader says so
    /// (`CountTooLarge`, at the count) before reading the items.
    fn cut(&mut self, name: String, at: u64) {
        self.cut_in_array(name, at, None)
    }

    /// Like [`Self::cut`], inside an array whose count is at `array.0` and
    /// whose items take at least `array.1` bytes each.
    fn cut_in_array(&mut self, name: String, at: u64, array: Option<(u64, u64)>) {
        let bytes = self.base[..at as usize].to_vec();
        let count = |offset: u64| {
            let o = offset as usize;
            u64::from_le_bytes(self.base[o..o + 8].try_into().expect("8 bytes"))
        };
        let too_many = |count_at: u64, min: u64| {
            at >= count_at + 8 && count(count_at).saturating_mul(min) > at - count_at - 8
        };
        let count_at = if too_many(8, 24) {
            Some(8)
        } else if too_many(16, 13) {
            Some(16)
        } else {
            array.filter(|&(c, min)| too_many(c, min)).map(|(c, _)| c)
        };
        match count_at {
            Some(c) => self.push(
                name,
                bytes,
                expect!("CountTooLarge", GgufError::CountTooLarge { offset, .. } if *offset == c),
            ),
            None => self.push(
                name,
                bytes,
                expect!("Truncated", GgufError::Truncated { offset, .. } if *offset <= at),
            ),
        }
    }

    fn truncations(&mut self, g: &Gguf, l: &Layout) {
        for (name, at) in [
            ("empty", 0),
            ("mid_magic", 2),
            ("after_magic", 4),
            ("after_version", 8),
        ] {
            self.cut(format!("truncated_{name}"), at);
        }
        self.cut("truncated_after_tensor_count".into(), 16);
        self.cut("truncated_after_counts".into(), 24);
        for (i, &kv) in l.kv.iter().enumerate() {
            self.cut(format!("truncated_in_kv{i}_key"), kv + 3);
            self.cut(format!("truncated_in_kv{i}_value"), l.kv_value[i] + 1);
            // A file without tensors legitimately ends after its last KV.
            if let Some(&end) = l.kv.get(i + 1).or(l.tensor_info.first()) {
                self.cut(format!("truncated_after_kv{i}"), end);
            }
        }
        for i in 0..l.tensor_info.len() {
            let f = info_fields(g, l, i);
            self.cut(format!("truncated_in_tensor_info{i}_dims"), f.dims + 1);
            if i + 1 < l.tensor_info.len() {
                self.cut(
                    format!("truncated_after_tensor_info{i}"),
                    l.tensor_info[i + 1],
                );
            } else {
                self.cut(format!("truncated_in_tensor_info{i}_offset"), f.offset + 7);
            }
        }
        let bounds = || expect!("OutOfBounds", GgufError::OutOfBounds { .. });
        if let Some((last, _)) = g
            .tensor_infos()
            .iter()
            .enumerate()
            .max_by_key(|(_, t)| t.offset)
        {
            let end = l.tensor_data[last] + g.tensor_infos()[last].n_bytes;
            self.push(
                "truncated_after_tensor_infos".into(),
                self.base[..l.tensor_infos_end as usize].to_vec(),
                bounds(),
            );
            self.push(
                "truncated_at_data_start".into(),
                self.base[..l.data_start as usize].to_vec(),
                bounds(),
            );
            let mid = (l.tensor_data[last] + end) / 2;
            self.push(
                "truncated_mid_last_tensor".into(),
                self.base[..mid as usize].to_vec(),
                bounds(),
            );
            self.push(
                "truncated_last_tensor_byte".into(),
                self.base[..end as usize - 1].to_vec(),
                bounds(),
            );
            let mid_file = l.data_start + (end - l.data_start) / 2;
            self.push(
                "truncated_mid_data".into(),
                self.base[..mid_file as usize].to_vec(),
                bounds(),
            );
        }
    }

    fn header(&mut self) {
        for (name, magic) in [
            ("bad_magic", *b"GGUG"),
            ("zero_magic", [0; 4]),
            ("reversed_magic", *b"FUGG"),
        ] {
            let b = self.patch(0, &magic);
            self.push(
                name.into(),
                b,
                expect!("BadMagic", GgufError::BadMagic { .. }),
            );
        }
        for version in [0u32, 1, 4, 0x0300_0000] {
            let b = self.patch(4, &version.to_le_bytes());
            self.push(
                format!("version_{version:#x}"),
                b,
                expect!("BadVersion", GgufError::BadVersion(v) if *v == version),
            );
        }
        let file_len = self.base.len() as u64;
        for (name, at, count) in [
            ("tensor_count_max", 8, u64::MAX),
            ("tensor_count_file_len", 8, file_len),
            ("kv_count_max", 16, u64::MAX),
            ("kv_count_file_len", 16, file_len),
        ] {
            let b = self.patch(at, &count.to_le_bytes());
            self.push(
                name.into(),
                b,
                expect!("CountTooLarge", GgufError::CountTooLarge { offset, .. } if *offset == at),
            );
        }
    }

    fn metadata(&mut self, g: &Gguf, l: &Layout) {
        let Some(&kv0) = l.kv.first() else { return };
        let too_long = |at: u64| expect!("StringTooLong", GgufError::StringTooLong { offset, .. } if *offset == at);
        for (name, len) in [
            ("key_len_max", u64::MAX),
            ("key_len_file_len", self.base.len() as u64),
        ] {
            let b = self.patch(kv0, &len.to_le_bytes());
            self.push(name.into(), b, too_long(kv0));
        }
        let b = self.patch(kv0 + 8, &[0xff]);
        self.push(
            "key_bad_utf8".into(),
            b,
            expect!("BadUtf8", GgufError::BadUtf8 { offset } if *offset == kv0),
        );
        let ty_at = l.kv_value[0] - 4;
        for ty in [13u32, u32::MAX] {
            let b = self.patch(ty_at, &ty.to_le_bytes());
            self.push(
                format!("kv0_value_type_{ty}"),
                b,
                expect!("BadValueType", GgufError::BadValueType { offset, .. } if *offset == ty_at),
            );
        }
        let md = g.metadata();
        if let Some(i) = md.iter().position(|(_, v)| matches!(v, Value::String(_))) {
            let at = l.kv_value[i];
            let b = self.patch(at, &u64::MAX.to_le_bytes());
            self.push(format!("kv{i}_string_len_max"), b, too_long(at));
        }
        if let Some(i) = md.iter().position(|(_, v)| matches!(v, Value::Array(..))) {
            let at = l.kv_value[i];
            let b = self.patch(at, &99u32.to_le_bytes());
            self.push(
                format!("kv{i}_array_elem_type"),
                b,
                expect!("BadValueType", GgufError::BadValueType { ty: 99, offset } if *offset == at),
            );
            let b = self.patch(at + 4, &u64::MAX.to_le_bytes());
            self.push(
                format!("kv{i}_array_count_max"),
                b,
                expect!("CountTooLarge", GgufError::CountTooLarge { offset, .. } if *offset == at + 4),
            );
        }
        let strings = md.iter().position(
            |(_, v)| matches!(v, Value::Array(Array::String(items)) if !items.is_empty()),
        );
        if let Some(i) = strings {
            let at = l.kv_value[i] + 12;
            let b = self.patch(at, &u64::MAX.to_le_bytes());
            self.push(format!("kv{i}_array_string_len_max"), b, too_long(at));
            let end =
                l.kv.get(i + 1)
                    .or(l.tensor_info.first())
                    .copied()
                    .unwrap_or(l.tensor_infos_end);
            for (where_, cut) in [("first", at + 9), ("middle", (at + end) / 2)] {
                self.cut_in_array(
                    format!("truncated_in_kv{i}_string_array_{where_}"),
                    cut,
                    Some((at - 8, 8)),
                );
            }
            // One byte short: the last string's length runs past the end.
            let last_len = match &md[i].1 {
                Value::Array(Array::String(items)) => {
                    items.iter().last().map_or(0, str::len) as u64
                }
                _ => 0,
            };
            if last_len > 0 {
                let len_at = end - last_len - 8;
                let bytes = self.base[..end as usize - 1].to_vec();
                self.push(
                    format!("truncated_in_kv{i}_string_array_last"),
                    bytes,
                    too_long(len_at),
                );
            }
        }
    }

    fn tensor_infos(&mut self, g: &Gguf, l: &Layout) {
        let infos = g.tensor_infos();
        // The shape patches below write dims[0].
        if infos.first().is_none_or(|t| t.dims.is_empty()) {
            return;
        }
        let f = info_fields(g, l, 0);
        let name0 = infos[0].name.clone();
        let b = self.patch(f.name_len, &u64::MAX.to_le_bytes());
        self.push(
            "tensor0_name_len_max".into(),
            b,
            expect!("StringTooLong", GgufError::StringTooLong { offset, .. } if *offset == f.name_len),
        );
        for n_dims in [5u32, u32::MAX] {
            let b = self.patch(f.n_dims, &n_dims.to_le_bytes());
            self.push(
                format!("tensor0_n_dims_{n_dims}"),
                b,
                expect!("BadDims", GgufError::BadDims { offset, .. } if *offset == f.n_dims),
            );
        }
        let b = self.patch(f.dims, &0u64.to_le_bytes());
        self.push(
            "tensor0_dim_zero".into(),
            b,
            expect!("ZeroDim", GgufError::ZeroDim { offset, .. } if *offset == f.n_dims),
        );
        for ty in [4u32, 1000, u32::MAX] {
            let b = self.patch(f.ty, &ty.to_le_bytes());
            let n = name0.clone();
            self.push(
                format!("tensor0_type_{ty}"),
                b,
                expect!("BadTensorType", GgufError::BadTensorType { name, offset, .. } if *name == n && *offset == f.ty),
            );
        }
        let mut b = self.patch(f.ty, &8u32.to_le_bytes());
        b[f.dims as usize..f.dims as usize + 8].copy_from_slice(&33u64.to_le_bytes());
        self.push(
            "tensor0_q8_0_row_33".into(),
            b,
            expect!("NotWholeBlocks", GgufError::NotWholeBlocks { offset, .. } if *offset == f.n_dims),
        );
        let info0 = l.tensor_info[0];
        let b = self.patch(f.offset, &(infos[0].offset + 1).to_le_bytes());
        self.push(
            "tensor0_offset_misaligned".into(),
            b,
            expect!("Misaligned", GgufError::Misaligned { info_offset, .. } if *info_offset == info0),
        );
        let align = g.alignment();
        for (name, off) in [
            ("max", u64::MAX / align * align),
            ("file_len", (self.base.len() as u64).next_multiple_of(align)),
        ] {
            let b = self.patch(f.offset, &off.to_le_bytes());
            self.push(
                format!("tensor0_offset_{name}"),
                b,
                expect!("OutOfBounds", GgufError::OutOfBounds { .. }),
            );
        }
        self.shapes(g, l);
        self.overlaps(g, l);
    }

    /// Shapes whose element or byte counts overflow.
    fn shapes(&mut self, g: &Gguf, l: &Layout) {
        let overflow = || expect!("DimsOverflow", GgufError::DimsOverflow { .. });
        let infos = g.tensor_infos();
        if let Some(i) = infos.iter().position(|t| t.dims.len() >= 2) {
            let f = info_fields(g, l, i);
            let mut b = self.patch(f.dims, &(1u64 << 32).to_le_bytes());
            b[f.dims as usize + 8..f.dims as usize + 16]
                .copy_from_slice(&(1u64 << 32).to_le_bytes());
            self.push(format!("tensor{i}_elements_overflow_u64"), b, overflow());
        }
        if let Some(i) = infos.iter().position(|t| t.dims.len() == 1) {
            let f = info_fields(g, l, i);
            let b = self.patch(f.dims, &(1u64 << 63).to_le_bytes());
            self.push(format!("tensor{i}_elements_over_i64"), b, overflow());
            // 2^62 elements fit int64, but not their bytes in u64.
            let mut b = self.patch(f.dims, &(1u64 << 62).to_le_bytes());
            b[f.ty as usize..f.ty as usize + 4].copy_from_slice(&0u32.to_le_bytes());
            self.push(format!("tensor{i}_f32_bytes_overflow"), b, overflow());
        }
    }

    fn overlaps(&mut self, g: &Gguf, l: &Layout) {
        let infos = g.tensor_infos();
        if infos.len() < 2 {
            return;
        }
        let mut by_offset: Vec<usize> = (0..infos.len()).collect();
        by_offset.sort_by_key(|&i| infos[i].offset);
        let (first, second, last) = (by_offset[0], by_offset[1], by_offset[infos.len() - 1]);
        let overlap = || expect!("Overlap", GgufError::Overlap { .. });
        let f = info_fields(g, l, second);
        let b = self.patch(f.offset, &infos[first].offset.to_le_bytes());
        self.push(
            format!("tensor{second}_offset_equals_tensor{first}"),
            b,
            overlap(),
        );
        // Multiplies the outermost dim of tensor i by `factor`.
        let base = self.base;
        let grow = |i: usize, factor: u64| {
            let t = &infos[i];
            let k = t.dims.len().checked_sub(1)?;
            let at = (info_fields(g, l, i).dims + 8 * k as u64) as usize;
            let mut b = base.to_vec();
            b[at..at + 8].copy_from_slice(&t.dims[k].checked_mul(factor)?.to_le_bytes());
            Some((b, l.tensor_data[i] + t.n_bytes * factor > base.len() as u64))
        };
        if let Some((b, past_eof)) = grow(first, 2) {
            let name = format!("tensor{first}_doubled");
            match past_eof {
                true => self.push(
                    name,
                    b,
                    expect!("OutOfBounds", GgufError::OutOfBounds { .. }),
                ),
                false => self.push(name, b, overlap()),
            }
        }
        // Past the last tensor's alignment padding, so past the end of file.
        if let Some((b, _)) = grow(last, g.alignment() + 1) {
            self.push(
                format!("tensor{last}_grown_past_eof"),
                b,
                expect!("OutOfBounds", GgufError::OutOfBounds { .. }),
            );
        }
        let same_len = (0..infos.len())
            .flat_map(|i| (i + 1..infos.len()).map(move |j| (i, j)))
            .find(|&(i, j)| infos[i].name.len() == infos[j].name.len());
        if let Some((i, j)) = same_len {
            let fj = info_fields(g, l, j);
            let info_j = l.tensor_info[j];
            let b = self.patch(fj.name, infos[i].name.as_bytes());
            self.push(
                format!("tensor{j}_named_like_tensor{i}"),
                b,
                expect!("DuplicateTensor", GgufError::DuplicateTensor { offset, .. } if *offset == info_j),
            );
        }
    }

    /// Variants that need the file re-written, not patched.
    fn rewritten(&mut self, g: &Gguf) -> Result<(), WriteError> {
        if let Some((key, value)) = g.metadata().first() {
            let mut w = GgufWriter::from_gguf(g);
            w.metadata(key.clone(), value.clone());
            self.push(
                "duplicate_key".into(),
                w.to_bytes()?,
                expect!("DuplicateKey", GgufError::DuplicateKey { .. }),
            );
        }
        let mut nested = Array::from(vec![1u8]);
        for _ in 0..9 {
            nested = Array::Array(vec![nested]);
        }
        let mut w = GgufWriter::from_gguf(g);
        w.metadata("test.nested", Value::Array(nested));
        self.push(
            "nesting_too_deep".into(),
            w.to_bytes()?,
            expect!("NestingTooDeep", GgufError::NestingTooDeep { .. }),
        );
        // general.alignment 64 written validly, then patched to bad values.
        let mut w = GgufWriter::from_gguf(g);
        w.alignment(64);
        let (b, l) = w.to_bytes_with_layout()?;
        let i = w_alignment_index(&w);
        let at = l.kv_value[i];
        for a in [0u32, 3, 48] {
            let mut b = b.clone();
            b[at as usize..at as usize + 4].copy_from_slice(&a.to_le_bytes());
            self.push(
                format!("alignment_{a}"),
                b,
                expect!("BadAlignment", GgufError::BadAlignment { offset, .. } if *offset == at),
            );
        }
        Ok(())
    }
}

fn w_alignment_index(w: &GgufWriter<'_>) -> usize {
    w.metadata_keys()
        .position(|k| k == "general.alignment")
        .expect("alignment() just set general.alignment")
}
