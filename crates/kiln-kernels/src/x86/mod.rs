//! x86-64 kernels. The kernels are written once in [`kern`], generic over
//! a [`kern::Simd`] token (AVX2 with 8 lanes, AVX-512 with 16), and
//! instantiated inside one `#[target_feature]` entry point per level so
//! that everything inlines into code compiled for that level.

/// The per-ISA entry points: each monomorphizes a generic kernel for one
/// `Simd` level inside a `#[target_feature]` function, so the kernel bodies
/// are written once (in `kern`/`rows`) and only these wrappers repeat.
macro_rules! entry_points {
    ($simd:ident, $features:literal, $gemm_rows:literal, $gemm_cols:literal) => {
        /// # Safety
        /// The CPU must support every feature in this function's
        /// `target_feature` list.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn gemv(
            ty: GgmlType,
            w: &[u8],
            row_bytes: usize,
            k: usize,
            x: &[f32],
            y: &mut [f32],
        ) -> bool {
            // SAFETY: this function's contract.
            let s = unsafe { $simd::new() };
            kern::gemv(s, ty, w, row_bytes, k, x, y)
        }

        /// # Safety
        /// As [`gemv`].
        #[target_feature(enable = $features)]
        pub(super) unsafe fn gemm(
            ty: GgmlType,
            w: &[u8],
            x: &[f32],
            y: &mut [f32],
            sh: &GemmShape,
        ) -> bool {
            // SAFETY: this function's contract.
            let s = unsafe { $simd::new() };
            kern::gemm(
                s,
                ty,
                w,
                x,
                kern::Out::Slice(y),
                sh,
                tile::Micro::<$gemm_rows, $gemm_cols>,
            )
        }

        /// # Safety
        /// As [`gemv`].
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn dot_rows(
            q: &[f32],
            g: usize,
            d: usize,
            m: &[f32],
            stride: usize,
            n: usize,
            out: &mut [f32],
        ) {
            // SAFETY: this function's contract.
            let s = unsafe { $simd::new() };
            rows::dot_rows(s, q, g, d, m, stride, n, out)
        }

        /// # Safety
        /// As [`gemv`].
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        pub(super) unsafe fn axpy_rows(
            p: &[f32],
            g: usize,
            d: usize,
            m: &[f32],
            stride: usize,
            n: usize,
            acc: &mut [f32],
        ) {
            // SAFETY: this function's contract.
            let s = unsafe { $simd::new() };
            rows::axpy_rows(s, p, g, d, m, stride, n, acc)
        }

        /// # Safety
        /// As [`gemv`].
        #[target_feature(enable = $features)]
        pub(super) unsafe fn softcap(x: &mut [f32], c: f32) {
            // SAFETY: this function's contract.
            let s = unsafe { $simd::new() };
            rows::softcap(s, x, c)
        }

        /// # Safety
        /// As [`gemv`].
        #[target_feature(enable = $features)]
        pub(super) unsafe fn gelu_mul(g: &mut [f32], u: &[f32]) {
            // SAFETY: this function's contract.
            let s = unsafe { $simd::new() };
            rows::gelu_mul(s, g, u)
        }

        /// # Safety
        /// As [`gemv`].
        #[target_feature(enable = $features)]
        pub(super) unsafe fn softmax_step(
            x: &mut [f32],
            scale: f32,
            cap: Option<f32>,
            m: f32,
        ) -> (f32, f32) {
            // SAFETY: this function's contract.
            let s = unsafe { $simd::new() };
            rows::softmax_step(s, x, scale, cap, m)
        }
    };
}

/// Runs `$body` with `$B` naming the decoder listed for `$ty` (the
/// caller's `Variant => Decoder` pairs), else `$other`.
macro_rules! by_decoder {
    ($ty:expr, $B:ident => $body:expr, _ => $other:expr; $($v:ident => $d:ty),+ $(,)?) => {
        match $ty {
            $(GgmlType::$v => {
                type $B = $d;
                $body
            })+
            _ => $other,
        }
    };
}

mod amx;
mod avx2;
mod avx512;
mod coarse;
mod kern;
mod qdot;
pub(crate) mod qtile;
mod rows;
mod screen;
mod screen_vnni;
mod tile;

use kiln_quant::GgmlType;

pub(crate) use kern::Out;

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
        Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => unsafe {
            avx512::gemv(ty, w, row_bytes, k, x, y)
        },
    }
}

/// GEMM as [`gemv`]; every type `kiln_quant` dequantizes runs the SIMD
/// micro-kernel (types without a fast decoder use the scalar one), or on
/// [`Isa::Amx`] batches of [`amx::MIN_TOKENS`]+ the AMX tiles. A shared
/// output (`Out::Shared`) is taken by the AMX path only: `false` elsewhere.
///
/// # Safety
/// For `Out::Shared(y)`: `y` is valid for writes at `t * ldy + r`
/// (`t < n`, `r < rows`) and nothing else accesses those elements during
/// the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    k: usize,
    x: &[f32],
    n: usize,
    y: Out<'_>,
    ldy: usize,
) -> bool {
    let shape = kern::GemmShape {
        row_bytes,
        rows,
        k,
        n,
        ldy,
    };
    match (isa, y) {
        // SAFETY: `Isa::Amx` is at most `Isa::cpu_max()` only when
        // `amx::available()`, on top of the AVX-512 set; `y` per this
        // function's contract.
        (Isa::Amx, y) if n >= amx::MIN_TOKENS => unsafe { amx::gemm(ty, w, x, y, &shape) },
        (_, Out::Shared(_)) | (Isa::Scalar, _) => false,
        // SAFETY: `isa` is at most `Isa::cpu_max()`, so the CPU has AVX2,
        // FMA and F16C.
        (Isa::Avx2, Out::Slice(y)) => unsafe { avx2::gemm(ty, w, x, y, &shape) },
        // SAFETY: as above, with AVX-512 F/BW/VL.
        (Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx, Out::Slice(y)) => unsafe {
            avx512::gemm(ty, w, x, y, &shape)
        },
    }
}

/// Strided-row f32 dots (see `crate::dot_rows`); `false` on `Isa::Scalar`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_rows(
    isa: Isa,
    q: &[f32],
    g: usize,
    d: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    out: &mut [f32],
) -> bool {
    match isa {
        Isa::Scalar => return false,
        // SAFETY: `isa` is at most `Isa::cpu_max()` (see `gemv`).
        Isa::Avx2 => unsafe { avx2::dot_rows(q, g, d, m, stride, n, out) },
        // SAFETY: as above.
        Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => unsafe {
            avx512::dot_rows(q, g, d, m, stride, n, out)
        },
    }
    true
}

/// Weighted sums of strided f32 rows (see `crate::axpy_rows`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn axpy_rows(
    isa: Isa,
    p: &[f32],
    g: usize,
    d: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    acc: &mut [f32],
) -> bool {
    match isa {
        Isa::Scalar => return false,
        // SAFETY: `isa` is at most `Isa::cpu_max()` (see `gemv`).
        Isa::Avx2 => unsafe { avx2::axpy_rows(p, g, d, m, stride, n, acc) },
        // SAFETY: as above.
        Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => unsafe {
            avx512::axpy_rows(p, g, d, m, stride, n, acc)
        },
    }
    true
}

/// `x = c * tanh(x / c)`; `false` on `Isa::Scalar`.
pub(crate) fn softcap(isa: Isa, x: &mut [f32], c: f32) -> bool {
    match isa {
        Isa::Scalar => return false,
        // SAFETY: `isa` is at most `Isa::cpu_max()` (see `gemv`).
        Isa::Avx2 => unsafe { avx2::softcap(x, c) },
        // SAFETY: as above.
        Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => unsafe { avx512::softcap(x, c) },
    }
    true
}

/// `g = gelu_tanh(g) * u`; `false` on `Isa::Scalar`.
pub(crate) fn gelu_mul(isa: Isa, g: &mut [f32], u: &[f32]) -> bool {
    match isa {
        Isa::Scalar => return false,
        // SAFETY: `isa` is at most `Isa::cpu_max()` (see `gemv`).
        Isa::Avx2 => unsafe { avx2::gelu_mul(g, u) },
        // SAFETY: as above.
        Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => unsafe { avx512::gelu_mul(g, u) },
    }
    true
}

/// One online-softmax step (see `crate::softmax_step`); `None` on
/// `Isa::Scalar`.
pub(crate) fn softmax_step(
    isa: Isa,
    x: &mut [f32],
    scale: f32,
    cap: Option<f32>,
    m: f32,
) -> Option<(f32, f32)> {
    match isa {
        Isa::Scalar => None,
        // SAFETY: `isa` is at most `Isa::cpu_max()` (see `gemv`).
        Isa::Avx2 => Some(unsafe { avx2::softmax_step(x, scale, cap, m) }),
        // SAFETY: as above.
        Isa::Avx512 | Isa::Avx512Vnni | Isa::Amx => {
            Some(unsafe { avx512::softmax_step(x, scale, cap, m) })
        }
    }
}

/// Q8_0 screen (see `crate::screen`); `None` on `Isa::Scalar`.
pub(crate) fn screen_q8_0(
    isa: Isa,
    sx: &crate::screen::ScreenX,
    w: &[u8],
    row_bytes: usize,
    hi: &mut [f32],
) -> Option<f32> {
    match isa {
        Isa::Scalar => None,
        // SAFETY: `isa` is at most `Isa::cpu_max()` (see `gemv`), so AVX2,
        // FMA and F16C are present, and from `Avx512Vnni` AVX-512 VL and
        // VNNI; the caller checked the row layout.
        Isa::Avx2 | Isa::Avx512 => Some(unsafe { screen::screen_avx2(sx, w, row_bytes, hi) }),
        _ => Some(unsafe { screen::screen_vnni256(sx, w, row_bytes, hi) }),
    }
}

/// Multi-row Q8_0 screen (see `crate::screen_rows_multi`); `false` on
/// `Isa::Scalar` or rows too long for the kernel's stack scratch.
pub(crate) fn screen_q8_0_multi(
    isa: Isa,
    sxs: &[crate::screen::ScreenX],
    w: &[u8],
    row_bytes: usize,
    hi: &mut [f32],
    lo: &mut [f32],
) -> bool {
    match isa {
        Isa::Scalar => false,
        // SAFETY: `isa` is at most `Isa::cpu_max()`, so AVX-512 VNNI and
        // AVX2/FMA/F16C are present; the caller checked the shapes.
        Isa::Avx512Vnni | Isa::Amx if sxs.len() >= screen_vnni::MIN_ACTIVATIONS => unsafe {
            screen_vnni::screen_vnni_multi(sxs, w, row_bytes, hi, lo)
        },
        // SAFETY: as above, AVX2/FMA/F16C.
        _ => unsafe { screen::screen_avx2_multi(sxs, w, row_bytes, hi, lo) },
    }
}

/// Whether this CPU has AVX-512 VBMI (probed once): the coarse kernels'
/// `coarse::Vbmi` unpack needs it.
fn has_vbmi() -> bool {
    static VBMI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VBMI.get_or_init(|| std::arch::is_x86_feature_detected!("avx512vbmi"))
}

/// The coarse kernels' unpack at `isa` (clamped).
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum CoarseForm {
    /// `coarse::Vbmi`: AVX-512 VNNI and VBMI.
    Vbmi,
    /// `coarse::Avx2`: every other SIMD level.
    Avx2,
}

/// Which form [`screen_coarse`] and [`coarse_q8_0_row`] take at `isa`
/// (clamped) for rows of `nb` blocks; `None` on `Isa::Scalar`, and for
/// one-block rows below VBMI (the AVX2 unpack loads from 4 bytes before
/// a block's codes: the row's last two scales).
pub(crate) fn coarse_form(isa: Isa, nb: usize) -> Option<CoarseForm> {
    match isa {
        Isa::Scalar => None,
        Isa::Avx512Vnni | Isa::Amx if has_vbmi() => Some(CoarseForm::Vbmi),
        _ if nb >= 2 => Some(CoarseForm::Avx2),
        _ => None,
    }
}

/// [`coarse_form`] for the screen against `sx`: not `Avx2` for its rare
/// `x̂` (`coarse::scales_exact`).
pub(crate) fn coarse_screen_form(
    isa: Isa,
    nb: usize,
    sx: &crate::screen::ScreenX,
) -> Option<CoarseForm> {
    coarse_form(isa, nb).filter(|&f| f == CoarseForm::Vbmi || coarse::scales_exact(sx))
}

/// The coarse one-row screen (see `crate::coarse`); `None` where
/// [`coarse_screen_form`] has none and for rows longer than the kernel's
/// stack scratch.
pub(crate) fn screen_coarse(
    isa: Isa,
    sx: &crate::screen::ScreenX,
    c: &crate::coarse::CoarseRows,
    r0: usize,
    hi: &mut [f32],
) -> Option<f32> {
    if c.blocks() > coarse::MAX_BLOCKS {
        return None;
    }
    let form = coarse_screen_form(isa, c.blocks(), sx)?;
    // SAFETY: `isa` is at most `Isa::cpu_max()`, so AVX2, FMA and F16C
    // are present, and for `Vbmi` AVX-512 VL and VNNI, and VBMI was
    // probed; `Avx2` has rows of 2+ blocks; the caller checked the rows
    // and the row length.
    match form {
        CoarseForm::Vbmi => Some(unsafe { coarse::screen_vbmi(sx, c, r0, hi) }),
        CoarseForm::Avx2 => Some(unsafe { coarse::screen_avx2(sx, c, r0, hi) }),
    }
}

/// A coarse row back as Q8_0 bytes; `false` on `Isa::Scalar`.
pub(crate) fn coarse_q8_0_row(
    isa: Isa,
    c: &crate::coarse::CoarseRows,
    r: usize,
    out: &mut [u8],
) -> bool {
    // SAFETY: as in `screen_coarse`; the caller checked `r` and `out`.
    match coarse_form(isa, c.blocks()) {
        None => return false,
        Some(CoarseForm::Vbmi) => unsafe { coarse::q8_0_row_vbmi(c, r, out) },
        Some(CoarseForm::Avx2) => unsafe { coarse::q8_0_row_avx2(c, r, out) },
    }
    true
}

pub(crate) use screen_vnni::Packed;

/// [`Packed`] tiles of a Q8_0 matrix; `None` below AVX-512 VNNI or for
/// rows the form does not take.
pub(crate) fn pack_screen(
    isa: Isa,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    nb: usize,
) -> Option<Packed> {
    match isa {
        // SAFETY: `isa` is at most `Isa::cpu_max()`, so AVX-512 VNNI and
        // AVX2/FMA/F16C are present; the caller checked the shapes.
        Isa::Avx512Vnni | Isa::Amx => unsafe { Packed::new(w, row_bytes, rows, nb) },
        _ => None,
    }
}

/// The multi-row screen of packed tiles from `t0`; `false` below AVX-512
/// VNNI.
pub(crate) fn screen_packed_multi(
    isa: Isa,
    sxs: &[crate::screen::ScreenX],
    p: &Packed,
    t0: usize,
    hi: &mut [f32],
    lo: &mut [f32],
) -> bool {
    match isa {
        // SAFETY: as in `pack_screen`; the caller checked the tiles and
        // row lengths.
        Isa::Avx512Vnni | Isa::Amx => {
            unsafe { screen_vnni::screen_packed_multi(sxs, p, t0, hi, lo) };
            true
        }
        _ => false,
    }
}

/// Integer GEMV on [`crate::QuantX`] planes; `false` when `isa` or `ty`
/// has no integer kernel (the caller runs the f32 [`gemv`]).
pub(crate) fn gemv_q(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    qx: &crate::QuantX,
    y: &mut [f32],
) -> bool {
    match isa {
        Isa::Scalar => false,
        // SAFETY: `isa` is at most `Isa::cpu_max()` (see `gemv`); the
        // caller checked the row layout against `qx.len()`.
        Isa::Avx2 | Isa::Avx512 => unsafe { qdot::gemv_avx2(ty, w, row_bytes, qx, y) },
        // SAFETY: as above, with AVX-512 VNNI.
        Isa::Avx512Vnni | Isa::Amx => unsafe { qdot::gemv_vnni(ty, w, row_bytes, qx, y) },
    }
}

/// Whether [`gemv_q`] covers `ty` on some SIMD level.
pub(crate) fn has_qkernel(ty: GgmlType) -> bool {
    qdot::has_qkernel(ty)
}

/// Fewest tokens for which [`gemm`] takes the AMX path.
pub(crate) const AMX_MIN_TOKENS: usize = amx::MIN_TOKENS;

/// Whether AMX-BF16 tiles are usable (CPU and OS).
pub(crate) fn has_amx() -> bool {
    amx::available()
}

/// [`qtile::Tiles`] of a matrix of `ty`; `None` below AVX-512 VNNI or
/// for types the tiles do not take.
pub(crate) fn pack_qtiles(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    rows: usize,
    k: usize,
    pool: Option<&crate::pool::Pool>,
) -> Option<qtile::Tiles> {
    match isa {
        Isa::Avx512Vnni | Isa::Amx => qtile::Tiles::pack(ty, w, row_bytes, rows, k, pool),
        _ => None,
    }
}

/// The tiled integer GEMV of tiles `t0 .. t0 + tiles`; `false` below
/// AVX-512 VNNI.
pub(crate) fn gemv_qtiles(
    isa: Isa,
    p: &qtile::Tiles,
    t0: usize,
    tiles: usize,
    qxs: &[crate::QuantX],
    y: &mut [f32],
    ldy: usize,
) -> bool {
    match isa {
        // SAFETY: `isa` is at most `Isa::cpu_max()`; the caller checked
        // the shapes.
        Isa::Avx512Vnni | Isa::Amx => {
            unsafe { qtile::gemv(p, t0, tiles, qxs, y, ldy) };
            true
        }
        _ => false,
    }
}
