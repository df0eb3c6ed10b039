//! Split models: a fixture split by the writer (as llama.cpp's gguf-split
//! lays it out) opens from its first part with every tensor byte for byte
//! and the first part's metadata; a wrong part, a missing one or an
//! unfindable name is a clear error.

use std::path::{Path, PathBuf};

use kiln_gguf::write::{GgufWriter, WriteError};
use kiln_gguf::{split_file_name, Gguf, GgufError};

/// A fresh folder under the system temp dir, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!("kiln-gguf-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn fixture() -> Gguf {
    Gguf::open(kiln_testdata::fixture("gemma3-tiny/model-q8_0.gguf")).unwrap()
}

/// Writes `g` split in `n` parts as `dir/model-0000i-of-0000n.gguf`;
/// returns the parts' paths.
fn write_split(g: &Gguf, n: usize, dir: &Path) -> Vec<PathBuf> {
    let parts = GgufWriter::from_gguf(g).to_split_bytes(n).unwrap();
    parts
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let p = dir.join(split_file_name("model", i, n));
            std::fs::write(&p, bytes).unwrap();
            p
        })
        .collect()
}

#[test]
fn a_split_model_opens_as_one() {
    let whole = fixture();
    let dir = TempDir::new("split-ok");
    let paths = write_split(&whole, 3, &dir.0);
    assert!(paths[0].ends_with("model-00001-of-00003.gguf"));
    let g = Gguf::open(&paths[0]).unwrap();
    assert_eq!(g.n_parts(), 3);
    let sizes: u64 = paths.iter().map(|p| p.metadata().unwrap().len()).sum();
    assert_eq!(g.file_len(), sizes);
    assert_eq!(g.tensor_infos().len(), whole.tensor_infos().len());
    for t in whole.tensor_infos() {
        let (a, b) = (whole.tensor(&t.name).unwrap(), g.tensor(&t.name).unwrap());
        assert_eq!(a.dims(), b.dims(), "{}", t.name);
        assert_eq!(a.ty(), b.ty(), "{}", t.name);
        assert!(a.data == b.data, "{}: bytes differ", t.name);
    }
    for (k, v) in whole.metadata() {
        assert_eq!(g.get(k).map(|x| x.to_string()), Some(v.to_string()), "{k}");
    }
    assert_eq!(g.get_u32("split.count").unwrap(), 3);
    // Every part is itself a valid GGUF file holding only its own tensors.
    let second = GgufWriter::from_gguf(&whole).to_split_bytes(3).unwrap()[1].clone();
    let part = Gguf::from_bytes(second).unwrap();
    assert_eq!(part.get_u32("split.no").unwrap(), 1);
    assert!(part.tensor_infos().len() < whole.tensor_infos().len());
}

#[test]
fn a_later_part_names_the_first() {
    let dir = TempDir::new("split-later");
    let paths = write_split(&fixture(), 2, &dir.0);
    let e = Gguf::open(&paths[1]).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::SplitNotFirst {
                no: 2,
                count: 2,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("open the first part"), "{e}");
}

#[test]
fn a_missing_part_is_named() {
    let dir = TempDir::new("split-missing");
    let paths = write_split(&fixture(), 3, &dir.0);
    std::fs::remove_file(&paths[2]).unwrap();
    let e = Gguf::open(&paths[0]).unwrap_err();
    assert!(
        matches!(&e, GgufError::SplitPartMissing { no: 3, count: 3, path } if path == &paths[2]),
        "{e:?}"
    );
}

#[test]
fn a_renamed_first_part_cannot_find_the_others() {
    let dir = TempDir::new("split-name");
    let paths = write_split(&fixture(), 2, &dir.0);
    let renamed = dir.0.join("model.gguf");
    std::fs::rename(&paths[0], &renamed).unwrap();
    let e = Gguf::open(&renamed).unwrap_err();
    assert!(matches!(e, GgufError::SplitName { count: 2, .. }), "{e:?}");
}

#[test]
fn a_part_of_another_split_is_rejected() {
    let whole = fixture();
    let dir = TempDir::new("split-mix");
    let paths = write_split(&whole, 2, &dir.0);
    // Part 2 of a 3-way split where part 2 of the 2-way one belongs.
    let other = GgufWriter::from_gguf(&whole).to_split_bytes(3).unwrap();
    std::fs::write(&paths[1], &other[1]).unwrap();
    let e = Gguf::open(&paths[0]).unwrap_err();
    assert!(matches!(e, GgufError::SplitMismatch { .. }), "{e:?}");
    // A corrupt later part names its file.
    std::fs::write(&paths[1], b"GGUF\x03\0\0\0").unwrap();
    let e = Gguf::open(&paths[0]).unwrap_err();
    assert!(
        matches!(&e, GgufError::InPart { path, .. } if path == &paths[1]),
        "{e:?}"
    );
}

#[test]
fn impossible_splits_are_refused() {
    let whole = fixture();
    let n = whole.tensor_infos().len();
    let w = GgufWriter::from_gguf(&whole);
    assert!(matches!(w.to_split_bytes(0), Err(WriteError::Split { .. })));
    assert!(matches!(
        w.to_split_bytes(n + 1),
        Err(WriteError::Split { .. })
    ));
    assert_eq!(w.to_split_bytes(n).unwrap().len(), n);
}
