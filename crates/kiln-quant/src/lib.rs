//! GGML tensor types as stored in GGUF files: block layouts, scalar
//! dequantizers (the obviously-correct reference) and quantizers.
//!
//! Dequantizers are bit-exact with ggml's `dequantize_row_*` and gguf-py's
//! `gguf.quants.dequantize`; quantizers follow ggml's `quantize_row_*_ref`
//! (bit-exact with gguf-py where gguf-py has one). Nothing here allocates,
//! so [`dequantize`] and [`vec_dot_f32`] can run per weight row in hot loops.
//!
//! ```
//! use kiln_quant::{dequantize, quantize, vec_dot_f32, GgmlType};
//!
//! let x: Vec<f32> = (0..256).map(|i| (i as f32 * 0.1).sin()).collect();
//! let mut packed = vec![0u8; GgmlType::Q4K.block_bytes()];
//! quantize(GgmlType::Q4K, &x, &mut packed)?;
//!
//! let mut back = vec![0.0f32; 256];
//! dequantize(GgmlType::Q4K, &packed, &mut back)?;
//! // 4 bits over a group range of ~2: steps of ~0.13.
//! assert!(x.iter().zip(&back).all(|(a, b)| (a - b).abs() < 0.1));
//!
//! let ones = vec![1.0f32; 256];
//! let dot = vec_dot_f32(GgmlType::Q4K, &packed, &ones)?;
//! assert!((dot - back.iter().sum::<f32>()).abs() < 1e-3);
//! # Ok::<(), kiln_quant::QuantError>(())
//! ```

pub mod block;
mod dequant;
mod quant;
mod quant_k;
mod types;

pub use types::GgmlType;

use block::*;

/// Why a conversion was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QuantError {
    /// This crate has no dequantizer (or quantizer) for the type.
    Unsupported { ty: GgmlType, op: Op },
    /// The element count is not a whole number of blocks.
    PartialBlock { ty: GgmlType, n_elems: usize },
    /// The packed buffer does not hold exactly the bytes for `n_elems`.
    ByteLength {
        ty: GgmlType,
        n_elems: usize,
        expected_bytes: usize,
        actual_bytes: usize,
    },
}

/// The conversion named in [`QuantError::Unsupported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Dequantize,
    Quantize,
}

impl std::fmt::Display for QuantError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsupported { ty, op } => write!(f, "{op:?} is not supported for {ty}"),
            Self::PartialBlock { ty, n_elems } => write!(
                f,
                "{n_elems} elements is not a whole number of {ty} blocks of {}",
                ty.block_elems()
            ),
            Self::ByteLength {
                ty,
                n_elems,
                expected_bytes,
                actual_bytes,
            } => write!(
                f,
                "{n_elems} {ty} elements take {expected_bytes} bytes, got {actual_bytes}"
            ),
        }
    }
}

impl std::error::Error for QuantError {}

type DequantizeFn = fn(&[u8], &mut [f32]);
type QuantizeFn = fn(&[f32], &mut [u8]);

/// Per-type conversion table, as ggml's `type_traits`: one place to add a
/// type. Both functions take whole blocks with lengths already checked.
struct Codec {
    dequantize: DequantizeFn,
    quantize: Option<QuantizeFn>,
}

fn codec(ty: GgmlType) -> Option<Codec> {
    use GgmlType as T;
    let (dequantize, quantize): (DequantizeFn, Option<QuantizeFn>) = match ty {
        T::F32 => (dequant::f32s, Some(quant::f32s)),
        T::F16 => (dequant::f16s, Some(quant::f16s)),
        T::BF16 => (dequant::bf16s, Some(quant::bf16s)),
        T::Q4_0 => (
            |s, d| dequant::blocks(s, d, dequant::q4_0),
            Some(|s, d| quant::blocks(s, d, quant::q4_0)),
        ),
        T::Q4_1 => (
            |s, d| dequant::blocks(s, d, dequant::q4_1),
            Some(|s, d| quant::blocks(s, d, quant::q4_1)),
        ),
        T::Q5_0 => (
            |s, d| dequant::blocks(s, d, dequant::q5_0),
            Some(|s, d| quant::blocks(s, d, quant::q5_0)),
        ),
        T::Q5_1 => (
            |s, d| dequant::blocks(s, d, dequant::q5_1),
            Some(|s, d| quant::blocks(s, d, quant::q5_1)),
        ),
        T::Q8_0 => (
            |s, d| dequant::blocks(s, d, dequant::q8_0),
            Some(|s, d| quant::blocks(s, d, quant::q8_0)),
        ),
        T::Q2K => (
            |s, d| dequant::blocks(s, d, dequant::q2_k),
            Some(|s, d| quant::blocks(s, d, quant_k::q2_k)),
        ),
        T::Q3K => (|s, d| dequant::blocks(s, d, dequant::q3_k), None),
        T::Q4K => (
            |s, d| dequant::blocks(s, d, dequant::q4_k),
            Some(|s, d| quant::blocks(s, d, quant_k::q4_k)),
        ),
        T::Q5K => (
            |s, d| dequant::blocks(s, d, dequant::q5_k),
            Some(|s, d| quant::blocks(s, d, quant_k::q5_k)),
        ),
        T::Q6K => (
            |s, d| dequant::blocks(s, d, dequant::q6_k),
            Some(|s, d| quant::blocks(s, d, quant_k::q6_k)),
        ),
        T::Q8K => (
            |s, d| dequant::blocks(s, d, dequant::q8_k),
            Some(|s, d| quant::blocks(s, d, quant_k::q8_k)),
        ),
        T::IQ4NL => (|s, d| dequant::blocks(s, d, dequant::iq4_nl), None),
        T::IQ4XS => (|s, d| dequant::blocks(s, d, dequant::iq4_xs), None),
        _ => return None,
    };
    Some(Codec {
        dequantize,
        quantize,
    })
}

/// Whether [`dequantize`] and [`vec_dot_f32`] accept `ty`.
pub fn is_supported(ty: GgmlType) -> bool {
    codec(ty).is_some()
}

/// Whether [`quantize`] accepts `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    codec(ty).is_some_and(|c| c.quantize.is_some())
}

/// Checks that `n_elems` is whole blocks and `n_bytes` is exactly their size.
fn check_lengths(ty: GgmlType, n_elems: usize, n_bytes: usize) -> Result<(), QuantError> {
    if !n_elems.is_multiple_of(ty.block_elems()) {
        return Err(QuantError::PartialBlock { ty, n_elems });
    }
    let expected_bytes = n_elems / ty.block_elems() * ty.block_bytes();
    if n_bytes != expected_bytes {
        return Err(QuantError::ByteLength {
            ty,
            n_elems,
            expected_bytes,
            actual_bytes: n_bytes,
        });
    }
    Ok(())
}

/// Decodes `dst.len()` elements of type `ty` from `src`, which must hold
/// exactly their packed bytes (a whole number of blocks).
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let codec = codec(ty).ok_or(QuantError::Unsupported {
        ty,
        op: Op::Dequantize,
    })?;
    check_lengths(ty, dst.len(), src.len())?;
    (codec.dequantize)(src, dst);
    Ok(())
}

/// Encodes `src` as type `ty` into `dst`, which must be exactly the packed
/// size of `src.len()` elements. Uses ggml's reference (no importance
/// matrix) quantizers.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let quantize = codec(ty)
        .and_then(|c| c.quantize)
        .ok_or(QuantError::Unsupported {
            ty,
            op: Op::Quantize,
        })?;
    check_lengths(ty, src.len(), dst.len())?;
    quantize(src, dst);
    Ok(())
}

/// Elements decoded at a time by [`vec_dot_f32`]: a multiple of every
/// supported block size, and 1 KiB of stack.
const DOT_TILE: usize = QK_K;

/// Dot product of one packed row (`x.len()` elements of type `ty`) with `x`.
///
/// Decodes 256 elements at a time into a stack buffer and sums each tile in
/// f32 over eight interleaved lanes; tile sums are added in f64 so rows of
/// 16k elements lose no accuracy to the running total. This is the scalar
/// twin future SIMD kernels are tested against.
pub fn vec_dot_f32(ty: GgmlType, row: &[u8], x: &[f32]) -> Result<f32, QuantError> {
    let codec = codec(ty).ok_or(QuantError::Unsupported {
        ty,
        op: Op::Dequantize,
    })?;
    check_lengths(ty, x.len(), row.len())?;
    let tile_bytes = DOT_TILE / ty.block_elems() * ty.block_bytes();
    let mut buf = [0.0f32; DOT_TILE];
    let mut total = 0.0f64;
    for (src, xs) in row.chunks(tile_bytes).zip(x.chunks(DOT_TILE)) {
        // A short last tile is still whole blocks: x.len() is.
        let w = &mut buf[..xs.len()];
        (codec.dequantize)(src, w);
        total += f64::from(dot_lanes(w, xs));
    }
    Ok(total as f32)
}

/// f32 dot product over eight independent lanes: fixed summation order
/// (so results are reproducible) that the compiler can vectorize.
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (a8, a_rest) = a.split_at(a.len() / 8 * 8);
    let (b8, b_rest) = b.split_at(a8.len());
    for (ca, cb) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for k in 0..8 {
            lanes[k] += ca[k] * cb[k];
        }
    }
    let mut tail = 0.0f32;
    for (p, q) in a_rest.iter().zip(b_rest) {
        tail += p * q;
    }
    ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
        + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_lengths_and_types() {
        let mut out = [0.0f32; 32];
        assert_eq!(
            dequantize(GgmlType::Q8_0, &[0u8; 33], &mut out),
            Err(QuantError::ByteLength {
                ty: GgmlType::Q8_0,
                n_elems: 32,
                expected_bytes: 34,
                actual_bytes: 33
            })
        );
        assert_eq!(
            dequantize(GgmlType::Q8_0, &[0u8; 34], &mut out[..31]),
            Err(QuantError::PartialBlock {
                ty: GgmlType::Q8_0,
                n_elems: 31
            })
        );
        assert_eq!(
            dequantize(GgmlType::IQ2XXS, &[], &mut []),
            Err(QuantError::Unsupported {
                ty: GgmlType::IQ2XXS,
                op: Op::Dequantize
            })
        );
        assert_eq!(
            quantize(GgmlType::IQ4NL, &[0.0; 32], &mut [0u8; 18]),
            Err(QuantError::Unsupported {
                ty: GgmlType::IQ4NL,
                op: Op::Quantize
            })
        );
        assert!(matches!(
            vec_dot_f32(GgmlType::Q4K, &[0u8; 144], &[0.0; 255]),
            Err(QuantError::PartialBlock { .. })
        ));
    }

    #[test]
    fn empty_rows_are_fine() {
        assert_eq!(dequantize(GgmlType::Q6K, &[], &mut []), Ok(()));
        assert_eq!(vec_dot_f32(GgmlType::Q6K, &[], &[]), Ok(0.0));
    }

    #[test]
    fn supported_sets_match_the_brief() {
        use GgmlType as T;
        for ty in [
            T::F32,
            T::F16,
            T::BF16,
            T::Q4_0,
            T::Q4_1,
            T::Q5_0,
            T::Q5_1,
            T::Q8_0,
            T::Q2K,
            T::Q3K,
            T::Q4K,
            T::Q5K,
            T::Q6K,
            T::Q8K,
            T::IQ4NL,
            T::IQ4XS,
        ] {
            assert!(is_supported(ty), "{ty}");
        }
        for ty in [T::Q8_0, T::Q8K, T::Q4_0, T::Q4K, T::Q5_0, T::Q6K] {
            assert!(can_quantize(ty), "{ty}");
        }
        assert!(!is_supported(T::IQ2XXS));
    }

    #[test]
    fn q8_0_block_decodes_by_hand() {
        // d = 0.5 (f16 0x3800), q = -3, 0, 7, then zeros.
        let mut b = [0u8; 34];
        b[..2].copy_from_slice(&[0x00, 0x38]);
        b[2] = (-3i8) as u8;
        b[4] = 7;
        let mut y = [1.0f32; 32];
        dequantize(GgmlType::Q8_0, &b, &mut y).unwrap();
        assert_eq!(&y[..3], &[-1.5, 0.0, 3.5]);
        assert!(y[3..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn vec_dot_matches_dequantize_then_dot() {
        // Three Q8_0 blocks: a short tile exercises the tail path.
        let x: Vec<f32> = (0..96).map(|i| ((i * 37) % 23) as f32 - 11.0).collect();
        let mut packed = vec![0u8; 3 * 34];
        quantize(GgmlType::Q8_0, &x, &mut packed).unwrap();
        let mut w = vec![0.0f32; 96];
        dequantize(GgmlType::Q8_0, &packed, &mut w).unwrap();
        let v: Vec<f32> = (0..96).map(|i| (i as f32 * 0.3).cos()).collect();
        let want: f64 = w.iter().zip(&v).map(|(a, b)| *a as f64 * *b as f64).sum();
        let got = vec_dot_f32(GgmlType::Q8_0, &packed, &v).unwrap();
        assert!((got as f64 - want).abs() < 1e-4, "{got} vs {want}");
    }
}
