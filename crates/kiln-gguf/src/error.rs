use std::path::PathBuf;

pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// Everything that can be wrong with a GGUF file. Offsets are byte offsets
/// from the start of the file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: bad magic {found:?} at offset 0 (expected \"GGUF\")")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} at offset 4 (supported: 2, 3)")]
    BadVersion(u32),
    #[error("file truncated at offset {offset}: needed {needed} more bytes for {what}")]
    Truncated {
        offset: u64,
        needed: u64,
        what: &'static str,
    },
    #[error("{what} {count} at offset {offset} needs more bytes than the file has left (truncated or corrupt)")]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: u64,
    },
    #[error("{what} length {len} at offset {offset} runs past the end of the file")]
    StringTooLong {
        what: &'static str,
        len: u64,
        offset: u64,
    },
    #[error("string at offset {offset} is not valid UTF-8")]
    BadUtf8 { offset: u64 },
    #[error("unknown metadata value type {ty} at offset {offset}")]
    BadValueType { ty: u32, offset: u64 },
    #[error("metadata arrays nested deeper than {max} at offset {offset}")]
    NestingTooDeep { max: usize, offset: u64 },
    #[error("duplicate metadata key {key:?} at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("duplicate tensor name {name:?} at offset {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("tensor {name:?}: unknown ggml type {ty} at offset {offset}")]
    BadTensorType { name: String, ty: u32, offset: u64 },
    #[error("tensor {name:?}: {n_dims} dimensions at offset {offset} (at most 4)")]
    BadDims {
        name: String,
        n_dims: u32,
        offset: u64,
    },
    #[error("tensor {name:?}: dimensions {dims:?} at offset {offset} include a zero")]
    ZeroDim {
        name: String,
        dims: Vec<u64>,
        offset: u64,
    },
    #[error("tensor {name:?}: dimensions {dims:?} at offset {offset} overflow (element or byte count above 2^63)")]
    DimsOverflow {
        name: String,
        dims: Vec<u64>,
        offset: u64,
    },
    #[error("tensor {name:?}: row of {elems} elements at offset {offset} is not a whole number of {ty} blocks of {block}")]
    NotWholeBlocks {
        name: String,
        ty: GgmlTypeName,
        elems: u64,
        block: usize,
        offset: u64,
    },
    #[error("general.alignment {found} at offset {offset} is not a power of two > 0")]
    BadAlignment { found: String, offset: u64 },
    #[error("tensor {name:?}: data offset {offset} (tensor info at file offset {info_offset}) is not a multiple of the alignment {alignment}")]
    Misaligned {
        name: String,
        offset: u64,
        alignment: u64,
        info_offset: u64,
    },
    #[error("tensor {name:?}: data [{start}, {end}) lies outside the file's data section [{data_start}, {file_len}) (file truncated or offset corrupt)")]
    OutOfBounds {
        name: String,
        start: u64,
        end: u64,
        data_start: u64,
        file_len: u64,
    },
    #[error("tensors {a:?} and {b:?} overlap in the data section (at file offset {offset})")]
    Overlap { a: String, b: String, offset: u64 },
    #[error("metadata key {key:?} missing")]
    MissingKey { key: String },
    #[error("metadata key {key:?} has type {found}, expected {expected}")]
    WrongType {
        key: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error("tensor {0:?} not found")]
    MissingTensor(String),
    #[error("{path} is part {no} of a {count}-part split model: open the first part (NAME-00001-of-{count:05}.gguf)")]
    SplitNotFirst { path: PathBuf, no: u64, count: u64 },
    #[error("{path} is the first of {count} split parts but its name does not end in -00001-of-{count:05}.gguf, so the other parts cannot be found")]
    SplitName { path: PathBuf, count: u64 },
    #[error("split model part {no} of {count} is missing: {path}")]
    SplitPartMissing { path: PathBuf, no: u64, count: u64 },
    #[error("split model part {path}: {problem}")]
    SplitMismatch { path: PathBuf, problem: String },
    #[error("split model part {path}")]
    InPart {
        path: PathBuf,
        #[source]
        source: Box<GgufError>,
    },
}

/// A type name carried by errors (keeps the error `'static`).
pub type GgmlTypeName = &'static str;
