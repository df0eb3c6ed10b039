use std::sync::Arc;

use crate::reader::Backing;

/// GGUF metadata value type ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Encoded size of a scalar of this type (None for string/array).
    pub fn scalar_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// A decoded metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A borrowed metadata value: what [`Value::view`] and the items of an
/// [`Array`] are (array elements are stored by type, not as `Value`s).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ValueRef<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a str),
    Array(&'a Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A metadata array, its elements stored by type. Arrays parsed from a
/// file stay encoded in it (validated when parsed, decoded on access), so a
/// 262,144-token vocabulary costs 4 bytes a token for its string offsets
/// and nothing for its scores and types; arrays built in memory hold plain
/// vectors. The variant is the element type, so an empty array still says
/// what it holds; arrays of arrays hold inner arrays of any (each their
/// own) type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Scalars<u8>),
    I8(Scalars<i8>),
    U16(Scalars<u16>),
    I16(Scalars<i16>),
    U32(Scalars<u32>),
    I32(Scalars<i32>),
    F32(Scalars<f32>),
    Bool(Scalars<bool>),
    String(StringArray),
    Array(Vec<Array>),
    U64(Scalars<u64>),
    I64(Scalars<i64>),
    F64(Scalars<f64>),
}

/// Bytes of a parsed file, shared with it (the file's map stays alive as
/// long as any array points into it).
#[derive(Clone)]
pub(crate) struct FileSlice {
    pub(crate) file: Arc<Backing>,
    pub(crate) start: usize,
    pub(crate) len: usize,
}

impl FileSlice {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.file.bytes()[self.start..self.start + self.len]
    }
}

/// A fixed-size element type of GGUF arrays (sealed: the 11 scalar types).
pub trait Elem: Copy + PartialEq + std::fmt::Debug + private::Sealed {
    /// Encoded bytes per element.
    const SIZE: usize;
    /// Decodes one element from exactly `SIZE` little-endian bytes.
    fn decode(b: &[u8]) -> Self;
    /// Appends the element's encoding.
    fn encode(self, out: &mut Vec<u8>);
}

mod private {
    pub trait Sealed {}
}

macro_rules! elem {
    ($($t:ty),*) => {$(
        impl private::Sealed for $t {}
        impl Elem for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            fn decode(b: &[u8]) -> Self {
                <$t>::from_le_bytes(b.try_into().expect("SIZE bytes"))
            }
            fn encode(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
elem!(u8, i8, u16, i16, u32, i32, f32, u64, i64, f64);

impl private::Sealed for bool {}
/// ggml writes bools as one byte; any non-zero is true.
impl Elem for bool {
    const SIZE: usize = 1;
    fn decode(b: &[u8]) -> Self {
        b[0] != 0
    }
    fn encode(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
}

/// The elements of a fixed-size-type array: a vector, or the encoded
/// bytes in the file it was parsed from.
#[derive(Clone)]
pub struct Scalars<T> {
    store: ScalarStore<T>,
}

#[derive(Clone)]
enum ScalarStore<T> {
    Owned(Vec<T>),
    /// `len / T::SIZE` encoded elements.
    File(FileSlice),
}

impl<T: Elem> Scalars<T> {
    pub(crate) fn from_file(slice: FileSlice) -> Scalars<T> {
        Scalars {
            store: ScalarStore::File(slice),
        }
    }

    pub fn len(&self) -> usize {
        match &self.store {
            ScalarStore::Owned(v) => v.len(),
            ScalarStore::File(f) => f.len / T::SIZE,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn get(&self, i: usize) -> Option<T> {
        match &self.store {
            ScalarStore::Owned(v) => v.get(i).copied(),
            ScalarStore::File(f) => {
                (i < self.len()).then(|| T::decode(&f.bytes()[i * T::SIZE..(i + 1) * T::SIZE]))
            }
        }
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = T> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("index below len"))
    }

    pub fn to_vec(&self) -> Vec<T> {
        self.iter().collect()
    }

    /// Keeps the first `n` elements.
    pub fn truncate(&mut self, n: usize) {
        match &mut self.store {
            ScalarStore::Owned(v) => v.truncate(n),
            ScalarStore::File(f) => f.len = f.len.min(n * T::SIZE),
        }
    }

    /// Appends the elements' encoding (a file's bytes as they were).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match &self.store {
            ScalarStore::Owned(v) => v.iter().for_each(|x| x.encode(out)),
            ScalarStore::File(f) => out.extend_from_slice(f.bytes()),
        }
    }
}

impl<T> From<Vec<T>> for Scalars<T> {
    fn from(v: Vec<T>) -> Scalars<T> {
        Scalars {
            store: ScalarStore::Owned(v),
        }
    }
}

impl<T: Elem> PartialEq for Scalars<T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: Elem> PartialEq<[T]> for Scalars<T> {
    fn eq(&self, other: &[T]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

impl<T: Elem> std::fmt::Debug for Scalars<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// The strings of a string array: one text buffer with offsets, or the
/// length-prefixed strings in the file it was parsed from.
#[derive(Clone)]
pub struct StringArray {
    store: StrStore,
}

#[derive(Clone)]
enum StrStore {
    /// String `i` is `text[ends[i - 1]..ends[i]]` (from 0 for the first).
    Owned { text: String, ends: Vec<usize> },
    /// `[u64 length][UTF-8 bytes]` per string, validated when parsed;
    /// string `i` ends at `ends[i]` (from the slice start) and starts 8
    /// bytes after string `i - 1` ends. Shared, so clones are cheap.
    File { slice: FileSlice, ends: Arc<[u32]> },
}

impl Default for StringArray {
    fn default() -> StringArray {
        StringArray::new()
    }
}

impl StringArray {
    pub const fn new() -> StringArray {
        StringArray {
            store: StrStore::Owned {
                text: String::new(),
                ends: Vec::new(),
            },
        }
    }

    /// Room for `n` strings of `bytes` bytes in all.
    pub fn with_capacity(n: usize, bytes: usize) -> StringArray {
        StringArray {
            store: StrStore::Owned {
                text: String::with_capacity(bytes),
                ends: Vec::with_capacity(n),
            },
        }
    }

    /// Strings encoded in a file: `ends[i]` is where string `i` ends.
    pub(crate) fn from_file(slice: FileSlice, ends: Arc<[u32]>) -> StringArray {
        StringArray {
            store: StrStore::File { slice, ends },
        }
    }

    /// Appends a string (a file-backed array is copied into memory first).
    pub fn push(&mut self, s: &str) {
        if let StrStore::File { .. } = self.store {
            *self = self.iter().collect();
        }
        if let StrStore::Owned { text, ends } = &mut self.store {
            text.push_str(s);
            ends.push(text.len());
        }
    }

    pub fn len(&self) -> usize {
        match &self.store {
            StrStore::Owned { ends, .. } => ends.len(),
            StrStore::File { ends, .. } => ends.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total bytes of all strings.
    pub fn text_len(&self) -> usize {
        match &self.store {
            StrStore::Owned { text, .. } => text.len(),
            StrStore::File { ends, .. } => ends.last().map_or(0, |&e| e as usize - 8 * ends.len()),
        }
    }

    /// String `i`'s bytes, without the UTF-8 check of [`StringArray::get`]
    /// (for hot paths: hashing and comparing).
    pub fn get_bytes(&self, i: usize) -> Option<&[u8]> {
        match &self.store {
            StrStore::Owned { text, ends } => {
                let end = *ends.get(i)?;
                let start = if i == 0 { 0 } else { ends[i - 1] };
                Some(&text.as_bytes()[start..end])
            }
            StrStore::File { slice, ends } => {
                let end = *ends.get(i)? as usize;
                let start = if i == 0 { 0 } else { ends[i - 1] as usize } + 8;
                Some(&slice.bytes()[start..end])
            }
        }
    }

    /// String `i`; None past the end (or, for a file-backed array, if the
    /// file changed under its map since it was validated).
    pub fn get(&self, i: usize) -> Option<&str> {
        std::str::from_utf8(self.get_bytes(i)?).ok()
    }

    pub fn iter(&self) -> impl ExactSizeIterator<Item = &str> + DoubleEndedIterator + '_ {
        (0..self.len()).map(|i| self.get(i).unwrap_or_default())
    }

    /// Keeps the first `n` strings.
    pub fn truncate(&mut self, n: usize) {
        if n >= self.len() {
            return;
        }
        match &mut self.store {
            StrStore::Owned { text, ends } => {
                ends.truncate(n);
                text.truncate(ends.last().copied().unwrap_or(0));
            }
            StrStore::File { slice, ends } => {
                *ends = ends[..n].into();
                slice.len = ends.last().map_or(0, |&e| e as usize);
            }
        }
    }

    /// Appends the strings' encoding (a file's bytes as they were).
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match &self.store {
            StrStore::Owned { .. } => {
                for s in self.iter() {
                    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
                    out.extend_from_slice(s.as_bytes());
                }
            }
            StrStore::File { slice, .. } => out.extend_from_slice(slice.bytes()),
        }
    }
}

impl PartialEq for StringArray {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for StringArray {}

impl std::fmt::Debug for StringArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl<S: AsRef<str>> FromIterator<S> for StringArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut a = StringArray::new();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for StringArray {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for StringArray {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

/// `Array::from(vec)` for every element type.
macro_rules! array_from {
    ($($variant:ident($t:ty)),* $(,)?) => {$(
        impl From<Vec<$t>> for Array {
            fn from(v: Vec<$t>) -> Array {
                Array::$variant(v.into())
            }
        }
    )*};
}
array_from!(
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    U64(u64),
    I64(i64),
    F64(f64),
);

impl From<Vec<Array>> for Array {
    fn from(v: Vec<Array>) -> Array {
        Array::Array(v)
    }
}

impl From<StringArray> for Array {
    fn from(v: StringArray) -> Array {
        Array::String(v)
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

impl Array {
    /// An empty array of element type `ty`.
    pub fn empty(ty: ValueType) -> Array {
        match ty {
            ValueType::U8 => Array::U8(Vec::new().into()),
            ValueType::I8 => Array::I8(Vec::new().into()),
            ValueType::U16 => Array::U16(Vec::new().into()),
            ValueType::I16 => Array::I16(Vec::new().into()),
            ValueType::U32 => Array::U32(Vec::new().into()),
            ValueType::I32 => Array::I32(Vec::new().into()),
            ValueType::F32 => Array::F32(Vec::new().into()),
            ValueType::Bool => Array::Bool(Vec::new().into()),
            ValueType::String => Array::String(StringArray::new()),
            ValueType::Array => Array::Array(Vec::new()),
            ValueType::U64 => Array::U64(Vec::new().into()),
            ValueType::I64 => Array::I64(Vec::new().into()),
            ValueType::F64 => Array::F64(Vec::new().into()),
        }
    }

    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i`, borrowed.
    pub fn get(&self, i: usize) -> Option<ValueRef<'_>> {
        Some(match self {
            Array::U8(v) => ValueRef::U8(v.get(i)?),
            Array::I8(v) => ValueRef::I8(v.get(i)?),
            Array::U16(v) => ValueRef::U16(v.get(i)?),
            Array::I16(v) => ValueRef::I16(v.get(i)?),
            Array::U32(v) => ValueRef::U32(v.get(i)?),
            Array::I32(v) => ValueRef::I32(v.get(i)?),
            Array::F32(v) => ValueRef::F32(v.get(i)?),
            Array::Bool(v) => ValueRef::Bool(v.get(i)?),
            Array::String(v) => ValueRef::String(v.get(i)?),
            Array::Array(v) => ValueRef::Array(v.get(i)?),
            Array::U64(v) => ValueRef::U64(v.get(i)?),
            Array::I64(v) => ValueRef::I64(v.get(i)?),
            Array::F64(v) => ValueRef::F64(v.get(i)?),
        })
    }

    /// The elements in order, borrowed.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = ValueRef<'_>> + '_ {
        (0..self.len()).map(|i| self.get(i).expect("index below len"))
    }

    /// Keeps the first `n` elements.
    pub fn truncate(&mut self, n: usize) {
        match self {
            Array::U8(v) => v.truncate(n),
            Array::I8(v) => v.truncate(n),
            Array::U16(v) => v.truncate(n),
            Array::I16(v) => v.truncate(n),
            Array::U32(v) => v.truncate(n),
            Array::I32(v) => v.truncate(n),
            Array::F32(v) => v.truncate(n),
            Array::Bool(v) => v.truncate(n),
            Array::String(v) => v.truncate(n),
            Array::Array(v) => v.truncate(n),
            Array::U64(v) => v.truncate(n),
            Array::I64(v) => v.truncate(n),
            Array::F64(v) => v.truncate(n),
        }
    }

    /// The strings of a string array.
    pub fn as_strings(&self) -> Option<&StringArray> {
        match self {
            Array::String(s) => Some(s),
            _ => None,
        }
    }

    /// Appends the elements' encoding (after the type and count).
    pub(crate) fn encode_elements(&self, out: &mut Vec<u8>) {
        match self {
            Array::U8(v) => v.encode(out),
            Array::I8(v) => v.encode(out),
            Array::U16(v) => v.encode(out),
            Array::I16(v) => v.encode(out),
            Array::U32(v) => v.encode(out),
            Array::I32(v) => v.encode(out),
            Array::F32(v) => v.encode(out),
            Array::Bool(v) => v.encode(out),
            Array::String(v) => v.encode(out),
            Array::Array(v) => v.iter().for_each(|a| a.encode(out)),
            Array::U64(v) => v.encode(out),
            Array::I64(v) => v.encode(out),
            Array::F64(v) => v.encode(out),
        }
    }

    /// Appends the array's encoding: element type, count, elements.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.elem_type() as u32).to_le_bytes());
        out.extend_from_slice(&(self.len() as u64).to_le_bytes());
        self.encode_elements(out);
    }
}

impl Value {
    /// This value, borrowed (the form array elements come in).
    pub fn view(&self) -> ValueRef<'_> {
        match self {
            Value::U8(v) => ValueRef::U8(*v),
            Value::I8(v) => ValueRef::I8(*v),
            Value::U16(v) => ValueRef::U16(*v),
            Value::I16(v) => ValueRef::I16(*v),
            Value::U32(v) => ValueRef::U32(*v),
            Value::I32(v) => ValueRef::I32(*v),
            Value::F32(v) => ValueRef::F32(*v),
            Value::Bool(v) => ValueRef::Bool(*v),
            Value::String(s) => ValueRef::String(s),
            Value::Array(a) => ValueRef::Array(a),
            Value::U64(v) => ValueRef::U64(*v),
            Value::I64(v) => ValueRef::I64(*v),
            Value::F64(v) => ValueRef::F64(*v),
        }
    }

    pub fn value_type(&self) -> ValueType {
        self.view().value_type()
    }

    pub fn type_name(&self) -> &'static str {
        self.value_type().name()
    }

    /// Any integer type that fits in a u64 (negative values do not).
    pub fn as_u64(&self) -> Option<u64> {
        self.view().as_u64()
    }

    pub fn as_i64(&self) -> Option<i64> {
        self.view().as_i64()
    }

    /// Any numeric type as f64.
    pub fn as_f64(&self) -> Option<f64> {
        self.view().as_f64()
    }

    pub fn as_bool(&self) -> Option<bool> {
        self.view().as_bool()
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl<'a> ValueRef<'a> {
    pub fn value_type(self) -> ValueType {
        match self {
            ValueRef::U8(_) => ValueType::U8,
            ValueRef::I8(_) => ValueType::I8,
            ValueRef::U16(_) => ValueType::U16,
            ValueRef::I16(_) => ValueType::I16,
            ValueRef::U32(_) => ValueType::U32,
            ValueRef::I32(_) => ValueType::I32,
            ValueRef::F32(_) => ValueType::F32,
            ValueRef::Bool(_) => ValueType::Bool,
            ValueRef::String(_) => ValueType::String,
            ValueRef::Array(_) => ValueType::Array,
            ValueRef::U64(_) => ValueType::U64,
            ValueRef::I64(_) => ValueType::I64,
            ValueRef::F64(_) => ValueType::F64,
        }
    }

    pub fn type_name(self) -> &'static str {
        self.value_type().name()
    }

    /// Any integer type that fits in a u64 (negative values do not).
    pub fn as_u64(self) -> Option<u64> {
        match self {
            ValueRef::U8(v) => Some(v as u64),
            ValueRef::U16(v) => Some(v as u64),
            ValueRef::U32(v) => Some(v as u64),
            ValueRef::U64(v) => Some(v),
            ValueRef::I8(v) => u64::try_from(v).ok(),
            ValueRef::I16(v) => u64::try_from(v).ok(),
            ValueRef::I32(v) => u64::try_from(v).ok(),
            ValueRef::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_i64(self) -> Option<i64> {
        match self {
            ValueRef::U8(v) => Some(v as i64),
            ValueRef::U16(v) => Some(v as i64),
            ValueRef::U32(v) => Some(v as i64),
            ValueRef::U64(v) => i64::try_from(v).ok(),
            ValueRef::I8(v) => Some(v as i64),
            ValueRef::I16(v) => Some(v as i64),
            ValueRef::I32(v) => Some(v as i64),
            ValueRef::I64(v) => Some(v),
            _ => None,
        }
    }

    /// Any numeric type as f64.
    pub fn as_f64(self) -> Option<f64> {
        match self {
            ValueRef::F32(v) => Some(v as f64),
            ValueRef::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_bool(self) -> Option<bool> {
        match self {
            ValueRef::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_str(self) -> Option<&'a str> {
        match self {
            ValueRef::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(self) -> Option<&'a Array> {
        match self {
            ValueRef::Array(a) => Some(a),
            _ => None,
        }
    }

    /// An owned copy.
    pub fn to_value(self) -> Value {
        match self {
            ValueRef::U8(v) => Value::U8(v),
            ValueRef::I8(v) => Value::I8(v),
            ValueRef::U16(v) => Value::U16(v),
            ValueRef::I16(v) => Value::I16(v),
            ValueRef::U32(v) => Value::U32(v),
            ValueRef::I32(v) => Value::I32(v),
            ValueRef::F32(v) => Value::F32(v),
            ValueRef::Bool(v) => Value::Bool(v),
            ValueRef::String(s) => Value::String(s.to_string()),
            ValueRef::Array(a) => Value::Array(a.clone()),
            ValueRef::U64(v) => Value::U64(v),
            ValueRef::I64(v) => Value::I64(v),
            ValueRef::F64(v) => Value::F64(v),
        }
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.view().fmt(f)
    }
}

impl std::fmt::Display for ValueRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            ValueRef::U8(v) => write!(f, "{v}"),
            ValueRef::I8(v) => write!(f, "{v}"),
            ValueRef::U16(v) => write!(f, "{v}"),
            ValueRef::I16(v) => write!(f, "{v}"),
            ValueRef::U32(v) => write!(f, "{v}"),
            ValueRef::I32(v) => write!(f, "{v}"),
            ValueRef::F32(v) => write!(f, "{v}"),
            ValueRef::Bool(v) => write!(f, "{v}"),
            ValueRef::String(s) => write!(f, "{s:?}"),
            ValueRef::U64(v) => write!(f, "{v}"),
            ValueRef::I64(v) => write!(f, "{v}"),
            ValueRef::F64(v) => write!(f, "{v}"),
            ValueRef::Array(a) => a.fmt(f),
        }
    }
}

impl std::fmt::Display for Array {
    /// `[type; len]` and the first 8 elements.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}; {}]", self.elem_type().name(), self.len())?;
        if !self.is_empty() {
            f.write_str(" [")?;
            for (i, v) in self.iter().take(8).enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{v}")?;
            }
            if self.len() > 8 {
                f.write_str(", …")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}
