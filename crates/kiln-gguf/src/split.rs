//! Split models, as llama.cpp's gguf-split writes them: every part is a
//! complete GGUF file named `PREFIX-%05d-of-%05d.gguf`; the first holds all
//! metadata, every part holds `split.no` (0-based), `split.count` and
//! `split.tensors.count`, and each tensor's offset is relative to its own
//! part's data section.

use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::reader::Gguf;

pub(crate) const KEY_NO: &str = "split.no";
pub(crate) const KEY_COUNT: &str = "split.count";
pub(crate) const KEY_TENSORS: &str = "split.tensors.count";

/// The file name suffix of part `no` (0-based) of `count`.
fn part_suffix(no: u64, count: u64) -> String {
    format!("-{:05}-of-{count:05}.gguf", no + 1)
}

/// The file name of part `no` (0-based) of a `count`-part split model
/// (gguf-split's naming): `PREFIX-00001-of-00003.gguf`.
pub fn split_file_name(prefix: &str, no: usize, count: usize) -> String {
    format!("{prefix}{}", part_suffix(no as u64, count as u64))
}

/// `first` as it is when it is not split; else `first` with the tensors of
/// every other part (opened beside `path`) added.
pub(crate) fn join(mut first: Gguf, path: &Path) -> Result<Gguf> {
    let count = first.get(KEY_COUNT).and_then(|v| v.as_u64()).unwrap_or(1);
    if count <= 1 {
        return Ok(first);
    }
    let no = first.get(KEY_NO).and_then(|v| v.as_u64()).unwrap_or(0);
    if no != 0 {
        return Err(GgufError::SplitNotFirst {
            path: path.to_path_buf(),
            no: no + 1,
            count,
        });
    }
    let name = path.to_string_lossy();
    let Some(prefix) = name.strip_suffix(&part_suffix(0, count)) else {
        return Err(GgufError::SplitName {
            path: path.to_path_buf(),
            count,
        });
    };
    for no in 1..count {
        let part_path = PathBuf::from(format!("{prefix}{}", part_suffix(no, count)));
        let part = match Gguf::open_file(&part_path) {
            Ok(g) => g,
            Err(GgufError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(GgufError::SplitPartMissing {
                    path: part_path,
                    no: no + 1,
                    count,
                })
            }
            Err(e @ GgufError::Io { .. }) => return Err(e),
            Err(e) => {
                return Err(GgufError::InPart {
                    path: part_path,
                    source: Box::new(e),
                })
            }
        };
        add_part(&mut first, part, &part_path, no, count)?;
    }
    let expected = first.get(KEY_TENSORS).and_then(|v| v.as_u64());
    if let Some(n) = expected.filter(|&n| n != first.tensors.len() as u64) {
        return Err(GgufError::SplitMismatch {
            path: path.to_path_buf(),
            problem: format!(
                "{KEY_TENSORS} is {n} but the {count} parts hold {} tensors",
                first.tensors.len()
            ),
        });
    }
    Ok(first)
}

/// Moves `part`'s tensors into `model` after checking it is part `no`.
fn add_part(model: &mut Gguf, part: Gguf, path: &Path, no: u64, count: u64) -> Result<()> {
    let mismatch = |problem: String| GgufError::SplitMismatch {
        path: path.to_path_buf(),
        problem,
    };
    let key = |k: &str| part.get(k).and_then(|v| v.as_u64());
    if key(KEY_NO) != Some(no) || key(KEY_COUNT) != Some(count) {
        return Err(mismatch(format!(
            "its {KEY_NO}/{KEY_COUNT} are {:?}/{:?}, expected {no}/{count}",
            key(KEY_NO),
            key(KEY_COUNT)
        )));
    }
    let part_index = model.parts.len();
    let Gguf { parts, tensors, .. } = part;
    model.parts.extend(parts);
    for t in tensors {
        if model.tensor_index.contains_key(&t.name) {
            return Err(mismatch(format!(
                "tensor {:?} is also in an earlier part",
                t.name
            )));
        }
        model
            .tensor_index
            .insert(t.name.clone(), model.tensors.len());
        model.tensors.push(t);
        model.tensor_part.push(part_index);
    }
    Ok(())
}
