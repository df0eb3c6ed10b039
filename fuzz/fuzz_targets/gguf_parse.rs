//! Arbitrary bytes through the GGUF reader: it must return an error or a
//! file whose every tensor view lies inside the input, and the writer must
//! re-write an accepted file into one that parses to the same content.
#![no_main]

use kiln_gguf::write::GgufWriter;
use kiln_gguf::Gguf;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(g) = Gguf::from_bytes(data.to_vec()) else {
        return;
    };
    for (key, value) in g.metadata() {
        assert!(g.get(key).is_some());
        let _ = (
            value.to_string(),
            value.as_u64(),
            value.as_i64(),
            value.as_f64(),
        );
        let _ = (
            g.get_str_array(key),
            g.get_f32_array(key),
            g.get_i64_array(key),
        );
    }
    let _ = g.architecture();
    for t in g.tensor_infos() {
        let v = g.tensor(&t.name).expect("a listed tensor has a view");
        assert_eq!(v.data.len() as u64, t.n_bytes);
        assert!(g.data_start() + t.offset + t.n_bytes <= data.len() as u64);
        let rows = t.n_rows();
        assert_eq!((rows * t.row_bytes()) as u64, t.n_bytes);
        let _ = (v.row(0), v.row(rows - 1));
    }
    // Padding to a huge alignment would allocate that much: skip those.
    if g.alignment() > 4096 {
        return;
    }
    let Ok(bytes) = GgufWriter::from_gguf(&g).to_bytes() else {
        return;
    };
    let g2 = Gguf::from_bytes(bytes).expect("the writer's output parses");
    // Debug, not ==: NaN metadata values must compare equal.
    assert_eq!(
        format!("{:?}", g.metadata()),
        format!("{:?}", g2.metadata())
    );
    assert_eq!(g.tensor_infos().len(), g2.tensor_infos().len());
    for t in g.tensor_infos() {
        let (a, b) = (g.tensor(&t.name), g2.tensor(&t.name));
        let (a, b) = (a.expect("listed"), b.expect("re-written"));
        assert_eq!((a.dims(), a.ty(), a.data), (b.dims(), b.ty(), b.data));
    }
});
