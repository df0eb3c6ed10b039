//! x86-64 kernels. The kernels are written once in [`kern`], generic over
//! a [`kern::Simd`] token (AVX2 with 8 lanes, AVX-512 with 16), and
//! instantiated inside one `#[target_feature]` entry point per level so
//! that everything inlines into code compiled for that level.

mod avx2;
mod avx512;
mod kern;

use kiln_quant::GgmlType;

use crate::Isa;

/// Runs the SIMD GEMV for `isa` (already clamped to the CPU) when there is
/// a fast path for `ty` and this shape; `false` leaves it to the caller.
pub(crate) fn gemv(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
) -> bool {
    if !kern::has_kernel(ty, k) {
        return false;
    }
    match isa {
        Isa::Scalar => false,
        // SAFETY: `isa` is at most `Isa::cpu_max()`, so the CPU has AVX2,
        // FMA and F16C.
        Isa::Avx2 => unsafe { avx2::gemv(ty, w, row_bytes, k, x, y) },
        // SAFETY: as above, with AVX-512 F/BW/VL.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { avx512::gemv(ty, w, row_bytes, k, x, y) },
    }
}

/// GEMM as [`gemv`]; every type `kiln_quant` dequantizes runs the SIMD
/// micro-kernel (types without a fast decoder use the scalar one).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    k: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    ldy: usize,
) -> bool {
    let shape = kern::GemmShape {
        row_bytes,
        rows,
        k,
        n,
        ldy,
    };
    match isa {
        Isa::Scalar => false,
        // SAFETY: `isa` is at most `Isa::cpu_max()`, so the CPU has AVX2,
        // FMA and F16C.
        Isa::Avx2 => unsafe { avx2::gemm(ty, w, x, y, &shape) },
        // SAFETY: as above, with AVX-512 F/BW/VL.
        Isa::Avx512 | Isa::Avx512Vnni => unsafe { avx512::gemm(ty, w, x, y, &shape) },
    }
}
