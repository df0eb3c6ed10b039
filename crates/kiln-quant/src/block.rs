//! Block layouts of the quantized types, mirroring `ggml-common.h`.
//!
//! Every field is a byte array so the structs have alignment 1 and no
//! padding; multi-byte fields (f16 scales, `u32` high-bit masks, `i16` sums)
//! are little-endian, as in GGUF files. A compile-time assert ties each
//! struct's size to [`GgmlType::block_bytes`], so a layout typo fails the
//! build instead of corrupting weights.

use crate::GgmlType;

/// Elements in a K-quant super-block.
pub const QK_K: usize = 256;
/// Elements in a legacy (Q4_0 .. Q8_0, IQ4_NL) block.
pub const QK32: usize = 32;

/// Non-linear 4-bit codebook shared by IQ4_NL and IQ4_XS (`kvalues_iq4nl`).
pub const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

macro_rules! block_layout {
    (
        $(#[$meta:meta])*
        $name:ident = $ty:expr;
        { $($(#[$fmeta:meta])* $field:ident: $n:literal),* $(,)? }
    ) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: [u8; $n],)*
        }

        const _: () = assert!(core::mem::size_of::<$name>() == $ty.block_bytes());

        impl $name {
            pub const TYPE: GgmlType = $ty;
            pub const BYTES: usize = $ty.block_bytes();
            pub const ELEMS: usize = $ty.block_elems();

            /// Splits one packed block into its fields.
            pub fn from_bytes(bytes: &[u8; Self::BYTES]) -> Self {
                let rest: &[u8] = bytes;
                $(
                    let ($field, rest) = rest
                        .split_first_chunk::<$n>()
                        .expect("field sizes sum to the block size");
                )*
                let _ = rest;
                Self { $($field: *$field,)* }
            }

            /// Packs the fields back into ggml's byte order.
            pub fn to_bytes(&self) -> [u8; Self::BYTES] {
                let mut out = [0u8; Self::BYTES];
                let rest: &mut [u8] = &mut out;
                $(
                    let (head, rest) = rest
                        .split_first_chunk_mut::<$n>()
                        .expect("field sizes sum to the block size");
                    *head = self.$field;
                )*
                let _ = rest;
                out
            }
        }
    };
}

block_layout! {
    /// `block_q4_0`: x = d * (q - 8), q in 0..16.
    BlockQ4_0 = GgmlType::Q4_0;
    {
        /// f16 scale.
        d: 2,
        /// Element j in the low nibble of byte j, element j+16 in the high one.
        qs: 16,
    }
}

block_layout! {
    /// `block_q4_1`: x = d * q + m, q in 0..16.
    BlockQ4_1 = GgmlType::Q4_1;
    { d: 2, m: 2, qs: 16 }
}

block_layout! {
    /// `block_q5_0`: x = d * (q - 16), q in 0..32.
    BlockQ5_0 = GgmlType::Q5_0;
    {
        d: 2,
        /// `u32`, bit j is the fifth bit of element j.
        qh: 4,
        /// Low four bits, nibble order as in Q4_0.
        qs: 16,
    }
}

block_layout! {
    /// `block_q5_1`: x = d * q + m, q in 0..32.
    BlockQ5_1 = GgmlType::Q5_1;
    { d: 2, m: 2, qh: 4, qs: 16 }
}

block_layout! {
    /// `block_q8_0`: x = d * q, q an `i8`.
    BlockQ8_0 = GgmlType::Q8_0;
    { d: 2, qs: 32 }
}

block_layout! {
    /// `block_q2_K`: 16 groups of 16; x = d * sc * q - dmin * m, q in 0..4.
    BlockQ2K = GgmlType::Q2K;
    {
        /// Group scale (low nibble) and min (high nibble).
        scales: 16,
        /// Four 2-bit values per byte: byte l of each 32-byte chunk holds
        /// elements l, l+32, l+64, l+96 of a 128-element half.
        qs: 64,
        d: 2,
        dmin: 2,
    }
}

block_layout! {
    /// `block_q3_K`: 16 groups of 16; x = d * (sc - 32) * (q - 4 * !hbit).
    BlockQ3K = GgmlType::Q3K;
    {
        /// High bit of each element: bit k of byte l is element l + 32k.
        hmask: 32,
        /// Low two bits, packed as Q2_K's `qs`.
        qs: 64,
        /// Sixteen 6-bit scales: low nibbles in bytes 0..8, high pairs in 8..12.
        scales: 12,
        d: 2,
    }
}

block_layout! {
    /// `block_q4_K`: 8 groups of 32; x = d * sc * q - dmin * m, q in 0..16.
    BlockQ4K = GgmlType::Q4K;
    {
        d: 2,
        dmin: 2,
        /// Eight 6-bit scales and mins, see [`scale_min_k4`].
        scales: 12,
        /// Each 32-byte chunk holds a 64-element span: low nibbles first.
        qs: 128,
    }
}

block_layout! {
    /// `block_q5_K`: Q4_K plus a fifth bit per element.
    BlockQ5K = GgmlType::Q5K;
    {
        d: 2,
        dmin: 2,
        scales: 12,
        /// Bit k of byte l is the fifth bit of element l + 32k.
        qh: 32,
        qs: 128,
    }
}

block_layout! {
    /// `block_q6_K`: 16 groups of 16; x = d * sc * (q - 32), q in 0..64.
    BlockQ6K = GgmlType::Q6K;
    {
        /// Low four bits; per 128-element half, 64 bytes.
        ql: 128,
        /// High two bits; per 128-element half, 32 bytes.
        qh: 64,
        /// `i8` group scales.
        scales: 16,
        d: 2,
    }
}

block_layout! {
    /// `block_q8_K`: x = d * q with an f32 scale; used for activations.
    BlockQ8K = GgmlType::Q8K;
    {
        /// f32 scale.
        d: 4,
        qs: 256,
        /// `i16` sums of each group of 16 `qs`.
        bsums: 32,
    }
}

block_layout! {
    /// `block_iq4_nl`: x = d * IQ4NL_VALUES[q].
    BlockIq4Nl = GgmlType::IQ4NL;
    { d: 2, qs: 16 }
}

block_layout! {
    /// `block_iq4_xs`: 8 groups of 32 with 6-bit scales; codebook as IQ4_NL.
    BlockIq4Xs = GgmlType::IQ4XS;
    {
        d: 2,
        /// `u16`, two high scale bits per group.
        scales_h: 2,
        /// Low scale nibbles, two groups per byte.
        scales_l: 4,
        qs: 128,
    }
}

/// The 6-bit scale and min of group `j` (0..8) of a Q4_K / Q5_K block
/// (`get_scale_min_k4`): groups 0..4 sit in the low six bits of bytes 0..8;
/// groups 4..8 keep their low nibbles in bytes 8..12 and their top two bits
/// in the spare high bits of bytes 0..8.
pub fn scale_min_k4(j: usize, scales: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The 6-bit scale of group `j` (0..16) of a Q3_K block, before the -32 bias.
pub fn scale_q3k(j: usize, scales: &[u8; 12]) -> u8 {
    let low = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    low | (high << 4)
}

pub fn f16_to_f32(b: [u8; 2]) -> f32 {
    half::f16::from_le_bytes(b).to_f32()
}

/// Round-to-nearest-even, as ggml's `GGML_FP32_TO_FP16` and numpy.
pub fn f32_to_f16(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

pub fn bf16_to_f32(b: [u8; 2]) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16)
}

/// `ggml_compute_fp32_to_bf16`: round to nearest even, NaN kept quiet.
pub fn f32_to_bf16(x: f32) -> [u8; 2] {
    let u = x.to_bits();
    let h = if (u & 0x7fff_ffff) > 0x7f80_0000 {
        (u >> 16) | 64
    } else {
        // u64 so that values just below +-inf round up without wrapping.
        ((u64::from(u) + 0x7fff + u64::from((u >> 16) & 1)) >> 16) as u32
    };
    (h as u16).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_round_trip_through_bytes() {
        let bytes: [u8; BlockQ4K::BYTES] = std::array::from_fn(|i| i as u8);
        let b = BlockQ4K::from_bytes(&bytes);
        assert_eq!(b.d, [0, 1]);
        assert_eq!(b.dmin, [2, 3]);
        assert_eq!(b.scales[0], 4);
        assert_eq!(b.qs[0], 16);
        assert_eq!(b.qs[127], 143);
        assert_eq!(b.to_bytes(), bytes);
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_keeps_nan_quiet() {
        assert_eq!(f32_to_bf16(1.0), [0x80, 0x3f]);
        // 1 + 2^-8 is halfway between two bf16 values: ties to the even one.
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), [0x80, 0x3f]);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), [0x82, 0x3f]);
        let nan = u16::from_le_bytes(f32_to_bf16(f32::from_bits(0x7f80_0001)));
        assert!(bf16_to_f32(nan.to_le_bytes()).is_nan());
        assert_eq!(bf16_to_f32([0x80, 0xbf]), -1.0);
    }

    #[test]
    fn k4_scales_unpack_high_bits() {
        let mut s = [0u8; 12];
        s[0] = 0b1100_0101; // group 0 scale 5, top bits of group 4's scale
        s[4] = 0b0100_0011; // group 0 min 3, top bits of group 4's min
        s[8] = 0x9A; // group 4: scale low nibble 0xA, min low nibble 0x9
        assert_eq!(scale_min_k4(0, &s), (5, 3));
        assert_eq!(scale_min_k4(4, &s), (0x3A, 0x19));
    }
}
