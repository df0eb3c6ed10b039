//! Bit-exact agreement with gguf-py's `gguf.quants` on the vectors written by
//! `scripts/gen-quant-vectors.py` (format described there).

use kiln_quant::{dequantize, is_supported, quantize, vec_dot_f32, GgmlType};

const VECTORS: &[u8] = include_bytes!("data/gguf_py_vectors.bin");

struct Record {
    quantize: bool,
    ty: GgmlType,
    packed: Vec<u8>,
    values: Vec<f32>,
}

fn take<'a>(buf: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = buf.split_at(n);
    *buf = tail;
    head
}

fn take_u32(buf: &mut &[u8]) -> u32 {
    u32::from_le_bytes(take(buf, 4).try_into().unwrap())
}

fn records() -> Vec<Record> {
    let mut buf = VECTORS;
    assert_eq!(take(&mut buf, 4), b"KQV1");
    let count = take_u32(&mut buf);
    let mut out = Vec::new();
    for _ in 0..count {
        let kind = take_u32(&mut buf);
        let id = take_u32(&mut buf);
        let n_elems = take_u32(&mut buf) as usize;
        let n_bytes = take_u32(&mut buf) as usize;
        let packed = take(&mut buf, n_bytes).to_vec();
        let values = take(&mut buf, 4 * n_elems)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        out.push(Record {
            quantize: kind == 1,
            ty: GgmlType::from_id(id).unwrap_or_else(|| panic!("unknown type id {id}")),
            packed,
            values,
        });
    }
    assert!(buf.is_empty(), "{} trailing bytes", buf.len());
    out
}

/// First mismatching element, reported with block index and both values.
fn first_f32_mismatch(ty: GgmlType, got: &[f32], want: &[f32]) -> Option<String> {
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())?;
    Some(format!(
        "{ty} dequantize: element {i} (block {}): got {:e} ({:#010x}), gguf-py {:e} ({:#010x})",
        i / ty.block_elems(),
        got[i],
        got[i].to_bits(),
        want[i],
        want[i].to_bits()
    ))
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    use GgmlType as T;
    let mut covered = Vec::new();
    let mut failures = Vec::new();
    for r in records().into_iter().filter(|r| !r.quantize) {
        let mut got = vec![f32::NAN; r.values.len()];
        dequantize(r.ty, &r.packed, &mut got).unwrap();
        failures.extend(first_f32_mismatch(r.ty, &got, &r.values));
        covered.push(r.ty);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every type kiln-quant decodes, but Q8_K (gguf-py has no Q8_K codec).
    for ty in GgmlType::ALL
        .into_iter()
        .filter(|&ty| is_supported(ty) && ty != T::Q8K)
    {
        assert!(
            covered.contains(&ty),
            "no gguf-py dequantize vectors for {ty}"
        );
    }
}

#[test]
fn quantize_matches_gguf_py_byte_for_byte() {
    use GgmlType as T;
    let mut covered = Vec::new();
    let mut failures = Vec::new();
    for r in records().into_iter().filter(|r| r.quantize) {
        let mut got = vec![0u8; r.packed.len()];
        quantize(r.ty, &r.values, &mut got).unwrap();
        if let Some(i) = got.iter().zip(&r.packed).position(|(a, b)| a != b) {
            let b = i / r.ty.block_bytes();
            let span = b * r.ty.block_bytes()..(b + 1) * r.ty.block_bytes();
            failures.push(format!(
                "{} quantize: byte {i} (block {b}) differs\n  got     {:02x?}\n  gguf-py {:02x?}",
                r.ty,
                &got[span.clone()],
                &r.packed[span]
            ));
        }
        covered.push(r.ty);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for ty in [T::F16, T::BF16, T::Q4_0, T::Q4_1, T::Q5_0, T::Q5_1, T::Q8_0] {
        assert!(
            covered.contains(&ty),
            "no gguf-py quantize vectors for {ty}"
        );
    }
}

#[test]
fn vec_dot_agrees_with_gguf_py_dequantized_rows() {
    for r in records().into_iter().filter(|r| !r.quantize) {
        if matches!(r.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            continue; // random bit patterns include infinities
        }
        let x: Vec<f32> = (0..r.values.len())
            .map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0)
            .collect();
        let want: f64 = r
            .values
            .iter()
            .zip(&x)
            .map(|(w, x)| *w as f64 * *x as f64)
            .sum();
        let scale: f64 = r
            .values
            .iter()
            .zip(&x)
            .map(|(w, x)| (*w as f64 * *x as f64).abs())
            .sum();
        let got = vec_dot_f32(r.ty, &r.packed, &x).unwrap() as f64;
        assert!(
            (got - want).abs() <= 1e-6 * scale,
            "{}: vec_dot {got} vs {want} (sum |terms| {scale})",
            r.ty
        );
    }
}
