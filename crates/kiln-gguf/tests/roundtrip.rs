//! The writer and the reader agree: every metadata value type (nested
//! arrays included), tensors of several types, v2 and v3, alignments; and
//! re-writing each fixture reproduces it byte for byte.

use kiln_gguf::write::{GgufWriter, WriteError};
use kiln_gguf::{Array, GgmlType, Gguf, GgufError, Value, ValueType};

/// A `Scalars` of the listed elements.
macro_rules! sv {
    ($($x:expr),* $(,)?) => {
        vec![$($x),*].into()
    };
}

fn every_value() -> Vec<(&'static str, Value)> {
    let strings = |v: &[&str]| Array::String(v.iter().collect());
    let arr = |a: Array| Value::Array(a);
    vec![
        ("t.u8", Value::U8(u8::MAX)),
        ("t.i8", Value::I8(i8::MIN)),
        ("t.u16", Value::U16(u16::MAX)),
        ("t.i16", Value::I16(i16::MIN)),
        ("t.u32", Value::U32(u32::MAX)),
        ("t.i32", Value::I32(i32::MIN)),
        ("t.f32", Value::F32(-1.5e-7)),
        ("t.f32_inf", Value::F32(f32::NEG_INFINITY)),
        ("t.bool_true", Value::Bool(true)),
        ("t.bool_false", Value::Bool(false)),
        ("t.string", Value::String("▁hello «wörld» 🦀\n\0end".into())),
        ("t.string_empty", Value::String(String::new())),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f64", Value::F64(std::f64::consts::PI)),
        ("", Value::U8(0)),
        ("t.arr_u8", arr(Array::U8(sv![0, 255]))),
        ("t.arr_i32", arr(Array::I32(sv![-1, 7]))),
        ("t.arr_f32", arr(Array::F32(sv![-1000.0, 0.25]))),
        ("t.arr_bool", arr(Array::Bool(sv![true, false]))),
        ("t.arr_u64", arr(Array::U64(sv![1 << 40]))),
        ("t.arr_i64", arr(Array::I64(sv![-(1 << 40)]))),
        ("t.arr_f64", arr(Array::F64(sv![1e300]))),
        ("t.arr_i8", arr(Array::I8(sv![-3]))),
        ("t.arr_u16", arr(Array::U16(sv![65535]))),
        ("t.arr_i16", arr(Array::I16(sv![-2]))),
        ("t.arr_u32", arr(Array::U32(sv![4]))),
        ("t.arr_empty", arr(Array::empty(ValueType::F32))),
        (
            "t.arr_strings",
            arr(strings(&["<pad>", "", "▁a b", "<0xFF>"])),
        ),
        (
            "t.arr_nested",
            arr(Array::Array(vec![
                strings(&["x", "yz"]),
                Array::U8(sv![9]),
                Array::Array(vec![Array::Bool(sv![true])]),
                Array::empty(ValueType::Array),
            ])),
        ),
    ]
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn every_value_type_round_trips() {
    for version in [2, 3] {
        let mut w = GgufWriter::new();
        w.version(version);
        for (k, v) in every_value() {
            w.metadata(k, v);
        }
        let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert_eq!(g.version(), version);
        let expected: Vec<(String, Value)> = every_value()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(g.metadata(), expected.as_slice());
        assert_eq!(
            *g.get_str_array("t.arr_strings").unwrap(),
            ["<pad>", "", "▁a b", "<0xFF>"]
        );
        assert_eq!(g.tensor_infos().len(), 0);
    }
}

/// The typed accessors convert between numeric element types, borrow
/// string arrays, and name the key on a type mismatch.
#[test]
fn array_accessors() {
    let mut w = GgufWriter::new();
    for (k, v) in every_value() {
        w.metadata(k, v);
    }
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.get_f32_array("t.arr_i32").unwrap(), [-1.0, 7.0]);
    assert_eq!(g.get_f32_array("t.arr_f64").unwrap(), [1e300f64 as f32]);
    assert_eq!(g.get_i64_array("t.arr_u16").unwrap(), [65535]);
    assert_eq!(g.get_bool_array("t.arr_bool").unwrap(), [true, false]);
    // An empty array holds no element of the wrong type.
    assert!(g.get_str_array("t.arr_empty").unwrap().is_empty());
    assert!(g.get_i64_array("t.arr_empty").unwrap().is_empty());
    for (key, r) in [
        ("t.arr_strings", g.get_f32_array("t.arr_strings").err()),
        ("t.arr_f32", g.get_i64_array("t.arr_f32").err()),
        ("t.u8", g.get_f32_array("t.u8").err()),
    ] {
        assert!(
            matches!(&r, Some(GgufError::WrongType { key: k, .. }) if k == key),
            "{r:?}"
        );
    }
    assert!(g.get_str_array("t.arr_u8").is_err());
    let strings = g.get_str_array("t.arr_strings").unwrap();
    assert_eq!(strings.get(2), Some("▁a b"));
    assert_eq!(strings.get(4), None);
    assert_eq!(strings.text_len(), 5 + 6 + 6);
    let nested = g.get_array("t.arr_nested").unwrap();
    assert_eq!(nested.elem_type(), ValueType::Array);
    let inner: Vec<ValueType> = nested
        .iter()
        .map(|v| v.as_array().unwrap().elem_type())
        .collect();
    assert_eq!(
        inner,
        [
            ValueType::String,
            ValueType::U8,
            ValueType::Array,
            ValueType::Array
        ]
    );
    assert_eq!(
        g.get("t.arr_strings").unwrap().to_string(),
        r#"[string; 4] ["<pad>", "", "▁a b", "<0xFF>"]"#
    );
    let mut long = Array::from((0..10).collect::<Vec<u32>>());
    assert_eq!(long.to_string(), "[u32; 10] [0, 1, 2, 3, 4, 5, 6, 7, …]");
    long.truncate(2);
    assert_eq!(long, Array::from(vec![0u32, 1]));
}

#[test]
fn nan_keeps_its_bits() {
    let nan = f32::from_bits(0x7fc0_1234);
    let mut w = GgufWriter::new();
    w.metadata("nan", Value::F32(nan));
    let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
    match g.get("nan") {
        Some(Value::F32(x)) => assert_eq!(x.to_bits(), 0x7fc0_1234),
        other => panic!("got {other:?}"),
    }
}

#[test]
fn tensors_round_trip_with_alignment() {
    let q8 = vec![7u8; 2 * 34];
    let q4k = vec![3u8; 144];
    let f16: Vec<u8> = (0..24).collect();
    for align in [1u32, 32, 64, 4096] {
        let mut w = GgufWriter::new();
        w.metadata("general.architecture", Value::String("gemma3".into()));
        w.alignment(align);
        w.tensor("a", &[3], GgmlType::F32, f32_bytes(&[1.0, -2.0, 3.5]))
            .unwrap();
        w.tensor("b", &[64], GgmlType::Q8_0, &q8[..]).unwrap();
        w.tensor("c", &[256, 1, 1, 1], GgmlType::Q4K, q4k.clone())
            .unwrap();
        w.tensor("d", &[3, 2, 2], GgmlType::F16, f16.clone())
            .unwrap();
        let (bytes, layout) = w.to_bytes_with_layout().unwrap();
        let g = Gguf::from_bytes(bytes).unwrap();
        let a = align as u64;
        assert_eq!(g.alignment(), a);
        assert_eq!(g.data_start(), layout.data_start);
        assert_eq!(g.data_start() % a, 0);
        let names: Vec<&str> = g.tensor_infos().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"]);
        for (t, &abs) in g.tensor_infos().iter().zip(&layout.tensor_data) {
            assert_eq!(t.offset % a, 0, "{}", t.name);
            assert_eq!(g.data_start() + t.offset, abs);
        }
        let a_view = g.tensor("a").unwrap();
        assert_eq!(a_view.data, f32_bytes(&[1.0, -2.0, 3.5]).as_slice());
        assert_eq!(g.tensor("b").unwrap().data, q8.as_slice());
        let c = g.tensor("c").unwrap();
        assert_eq!(
            (c.ty(), c.dims(), c.data),
            (GgmlType::Q4K, &[256u64, 1, 1, 1][..], q4k.as_slice())
        );
        let d = g.tensor("d").unwrap();
        assert_eq!(
            (d.info.n_elements, d.info.n_rows(), d.info.row_bytes()),
            (12, 4, 6)
        );
        assert_eq!(d.row(3), &f16[18..24]);
    }
}

#[test]
fn nesting_limit_is_eight_arrays() {
    let nest = |depth: usize| {
        let mut v = Array::U8(sv![1]);
        for _ in 1..depth {
            v = Array::Array(vec![v]);
        }
        let mut w = GgufWriter::new();
        w.metadata("n", Value::Array(v));
        Gguf::from_bytes(w.to_bytes().unwrap())
    };
    assert!(nest(8).is_ok());
    // Header 24, key 8+1, type 4, then 12 bytes (type, count) per level.
    let r = nest(9);
    assert!(
        matches!(
            r,
            Err(GgufError::NestingTooDeep {
                max: 8,
                offset: 133
            })
        ),
        "{r:?}"
    );
}

#[test]
fn writer_refuses_what_the_reader_would() {
    let mut w = GgufWriter::new();
    let e = w.tensor("t", &[3], GgmlType::F32, vec![0u8; 8]).err();
    assert!(
        matches!(
            e,
            Some(WriteError::DataLen {
                got: 8,
                expected: 12,
                ..
            })
        ),
        "{e:?}"
    );
    let e = w.tensor("t", &[33], GgmlType::Q8_0, vec![0u8; 34]).err();
    assert!(matches!(e, Some(WriteError::Shape { .. })), "{e:?}");
    let e = w.tensor("t", &[0, 4], GgmlType::F32, vec![]).err();
    assert!(matches!(e, Some(WriteError::Shape { .. })), "{e:?}");
    let e = w
        .tensor("t", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0u8; 4])
        .err();
    assert!(
        matches!(e, Some(WriteError::Dims { n_dims: 5, .. })),
        "{e:?}"
    );
    w.tensor("t", &[1], GgmlType::F32, vec![0u8; 4]).unwrap();
    let e = w.tensor("t", &[1], GgmlType::F32, vec![0u8; 4]).err();
    assert!(matches!(e, Some(WriteError::DuplicateTensor(_))), "{e:?}");

    let mut w = GgufWriter::new();
    w.alignment(3);
    assert!(matches!(w.to_bytes(), Err(WriteError::Alignment(_))));
    let mut w = GgufWriter::new();
    w.version(1);
    assert!(matches!(w.to_bytes(), Err(WriteError::Version(1))));
}

#[test]
fn open_reports_io_and_empty_files() {
    let missing = std::env::temp_dir().join("kiln-gguf-no-such-file.gguf");
    assert!(matches!(Gguf::open(&missing), Err(GgufError::Io { .. })));
    let empty = std::env::temp_dir().join(format!("kiln-gguf-empty-{}.gguf", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    let r = Gguf::open(&empty);
    std::fs::remove_file(&empty).unwrap();
    assert!(
        matches!(
            r,
            Err(GgufError::Truncated {
                offset: 0,
                what: "magic",
                ..
            })
        ),
        "{r:?}"
    );
}

/// gguf-py wrote the fixtures; re-writing them must give the same bytes, which
/// checks the writer's layout (padding, offsets, value encodings) against an
/// independent implementation.
#[test]
fn fixtures_rewrite_byte_identical() {
    let mut n = 0;
    for model in kiln_testdata::fixture_models() {
        for ty in ["f32", "f16", "q8_0"] {
            let path = kiln_testdata::fixture(&format!("{model}/model-{ty}.gguf"));
            let original = std::fs::read(&path).unwrap();
            let g = Gguf::open(&path).unwrap();
            let rewritten = GgufWriter::from_gguf(&g).to_bytes().unwrap();
            assert!(
                rewritten == original,
                "{} differs after re-writing",
                path.display()
            );
            n += 1;
        }
    }
    assert_eq!(n, 18);
}

#[test]
fn real_model_parses() {
    let g = Gguf::open(kiln_testdata::real_model()).unwrap();
    assert_eq!(g.architecture().unwrap(), "gemma3");
    assert_eq!(g.get_u32("gemma3.block_count").unwrap(), 18);
    assert_eq!(
        g.get_str_array("tokenizer.ggml.tokens").unwrap().len(),
        262144
    );
    let mut end = 0;
    for t in g.tensor_infos() {
        let v = g.tensor(&t.name).unwrap();
        assert_eq!(v.data.len() as u64, t.n_bytes);
        end = end.max(g.data_start() + t.offset + t.n_bytes);
    }
    assert!(end <= g.file_len() && g.file_len() - end < g.alignment());
    assert!(g.tensor_infos().iter().any(|t| t.ty == GgmlType::Q4K));
}

/// Released pages of a mapped tensor read back the same bytes (faulted in
/// again from the file); nothing is released for an unknown tensor, a
/// tensor too small to hold a whole 64 KiB span, or a file held in memory.
#[test]
fn released_pages_read_back_the_same_bytes() {
    let g = Gguf::open(kiln_testdata::real_model()).unwrap();
    let sum = |name: &str| {
        let d = g.tensor(name).unwrap().data;
        d.iter().enumerate().fold(0u64, |h, (i, &b)| {
            h.wrapping_mul(31).wrapping_add(u64::from(b) ^ i as u64)
        })
    };
    let name = "blk.0.ffn_gate.weight";
    let before = sum(name);
    assert!(g.release_pages(name));
    assert_eq!(sum(name), before);
    // Twice is fine too.
    assert!(g.release_pages(name));
    assert_eq!(sum(name), before);
    assert!(!g.release_pages("no.such.tensor"));
    assert!(!g.release_pages("blk.0.attn_norm.weight"));
    let bytes = std::fs::read(kiln_testdata::fixture("gemma3-tiny/model-f32.gguf")).unwrap();
    let owned = Gguf::from_bytes(bytes).unwrap();
    let any = owned.tensor_infos()[0].name.clone();
    assert!(!owned.release_pages(&any));
}
