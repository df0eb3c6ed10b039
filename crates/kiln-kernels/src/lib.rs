//! Packed-weight kernels for GGUF tensors with runtime ISA dispatch.
//!
//! Three entry points, all over rows of packed weights `w` (row `r` starts
//! at byte `r * row_bytes`, `k` elements of type `ty`) and f32 activations:
//!
//! * [`gemv`]: `y[r] = dot(W[r], x)` — the decode (one token) kernel.
//! * [`gemm`]: `Y[t][r] = dot(W[r], X[t])` for `n` tokens — the prefill
//!   kernel: a tile of weight rows is dequantized once into an f32 stack
//!   scratch and reused across tokens by a register-blocked micro-kernel;
//!   on [`Isa::Amx`] (batches of 48+ tokens, see [`gemm_uses_amx`]) the
//!   tile is split into three bf16 parts per operand and multiplied on AMX
//!   tiles.
//! * [`argmax_rows`]: the greedy LM head without writing logits.
//!
//! Accuracy: weights are dequantized inside the kernel and multiplied
//! against the f32 activations with f32 FMA (AMX: the six bf16 part
//! products above 2^-24, accumulated in f32); activations are never
//! quantized to fewer bits than f32 carries. Results match
//! `kiln_quant::dequantize` + an exact dot to about 1e-6 of
//! `sum |w_i x_i|` (the summation order differs).
//!
//! Fast paths (AVX2+FMA+F16C and AVX-512): Q4_0, Q5_0, Q8_0, Q4_K, Q5_K,
//! Q6_K, F16, BF16, F32 (plain types when `k % 32 == 0`). Every other type
//! `kiln_quant` can dequantize goes through the scalar reference in
//! [`gemv`] / [`argmax_rows`]; [`gemm`] dequantizes those rows with the
//! scalar reference and still uses the SIMD micro-kernel.
//! [`Isa::Avx512Vnni`] runs the AVX-512 f32 kernels: VNNI only helps int8
//! activations, which the default path does not use.
//!
//! Softcapping is left to the caller: `cap * tanh(z / cap)` is monotonic,
//! so [`argmax_rows`] is unaffected by it, and the full-logit path applies
//! it once per logit, which costs nothing next to the dot products.
//!
//! Threading is the caller's: split rows across threads by passing
//! sub-slices of `w` (and of `y` for [`gemv`]); for [`gemm`] either split
//! tokens (each thread gets whole rows of `X` and `Y`) or split rows into
//! a per-thread output block with `ldy` = its row count and scatter it
//! (`kiln-cpu` does the latter, so each weight byte is read once per
//! batch). [`pool`] is a small fork/join pool for the per-token GEMVs.
//!
//! Also here, for attention and the elementwise hot loops of a CPU
//! backend compiled without target features: [`dot_rows`] / [`axpy_rows`]
//! (scores and weighted values over strided K/V rows, several query heads
//! per row load), [`softmax_step`], [`softcap`] and [`gelu_mul`].

use std::sync::OnceLock;

use kiln_quant::GgmlType;

pub use coarse::{coarse_screen_runs, screen_coarse_rows, CoarseRows};
pub use qx::QuantX;
pub use screen::ScreenX;

mod coarse;
pub mod pool;
mod qx;
mod scalar;
mod screen;
#[cfg(test)]
mod test_util;
#[cfg(target_arch = "x86_64")]
mod x86;

/// Instruction-set level of the kernels. Ordered: each level needs the
/// features of the ones below it, so `min` clamps a request to the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust: the reference path.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F + BW + VL (plus the AVX2 set).
    Avx512,
    /// [`Isa::Avx512`] + AVX-512 VNNI.
    Avx512Vnni,
    /// [`Isa::Avx512Vnni`] + AMX-TILE/AMX-BF16 with the OS's permission:
    /// prefill GEMMs of 48+ tokens run on bf16 tiles (operands split in
    /// three parts, as exact as f32); everything else as `Avx512Vnni`.
    Amx,
}

impl Isa {
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Vnni,
        Isa::Amx,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Amx => "amx",
        }
    }

    /// Parses the names [`Isa::name`] gives (as `KILN_ISA` takes them).
    pub fn from_name(s: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(s.trim()))
    }

    /// The best level this CPU runs (probed once).
    pub fn cpu_max() -> Isa {
        static MAX: OnceLock<Isa> = OnceLock::new();
        *MAX.get_or_init(probe)
    }

    /// The level to use: [`Isa::cpu_max`], lowered by the environment
    /// variable `KILN_ISA=scalar|avx2|avx512|avx512vnni|amx` when set (read
    /// once; a level above the CPU's is clamped, an unknown name ignored).
    pub fn detect() -> Isa {
        static CHOSEN: OnceLock<Isa> = OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let max = Isa::cpu_max();
            std::env::var("KILN_ISA")
                .ok()
                .and_then(|v| Isa::from_name(&v))
                .map_or(max, |want| want.min(max))
        })
    }

    /// `Some(isa)` when this CPU can run `isa` (for tests and benchmarks
    /// that exercise every level), else `None`.
    pub fn force(isa: Isa) -> Option<Isa> {
        (isa <= Isa::cpu_max()).then_some(isa)
    }

    /// Every level this CPU runs, lowest first.
    pub fn available() -> impl Iterator<Item = Isa> {
        Isa::ALL.into_iter().filter(|&i| i <= Isa::cpu_max())
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn probe() -> Isa {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    let avx512 = avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl");
    match (avx2, avx512, has!("avx512vnni")) {
        (_, true, true) if has!("avx512bf16") && x86::has_amx() => Isa::Amx,
        (_, true, true) => Isa::Avx512Vnni,
        (_, true, false) => Isa::Avx512,
        (true, ..) => Isa::Avx2,
        _ => Isa::Scalar,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn probe() -> Isa {
    Isa::Scalar
}

/// Whether the SIMD levels have a dedicated kernel for `ty` (all other
/// supported types run the scalar reference in [`gemv`]).
pub fn has_fast_path(ty: GgmlType) -> bool {
    use GgmlType as T;
    matches!(
        ty,
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::Q4K | T::Q5K | T::Q6K | T::F16 | T::BF16 | T::F32
    )
}

/// Whether the kernels accept `ty` at all (what `kiln_quant` dequantizes).
pub fn is_supported(ty: GgmlType) -> bool {
    kiln_quant::is_supported(ty)
}

/// Why a kernel call was refused. Checked once per call, before any work.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KernelError {
    /// `kiln_quant` cannot dequantize the type.
    Unsupported(GgmlType),
    /// `k` is not a whole number of blocks of the type.
    PartialBlock { ty: GgmlType, k: usize },
    /// A buffer is too short or a stride too small for the shape.
    Shape(String),
}

impl std::fmt::Display for KernelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unsupported(ty) => write!(f, "no kernel for {ty}"),
            Self::PartialBlock { ty, k } => {
                write!(f, "k = {k} is not a whole number of {ty} blocks")
            }
            Self::Shape(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for KernelError {}

/// Checks type and row layout; returns the packed bytes of one row.
fn check_rows(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    rows: usize,
) -> Result<usize, KernelError> {
    if !is_supported(ty) {
        return Err(KernelError::Unsupported(ty));
    }
    if !k.is_multiple_of(ty.block_elems()) {
        return Err(KernelError::PartialBlock { ty, k });
    }
    let packed = k / ty.block_elems() * ty.block_bytes();
    if row_bytes < packed {
        return Err(KernelError::Shape(format!(
            "row_bytes {row_bytes} < {packed} bytes of {k} {ty} elements"
        )));
    }
    let need = rows.checked_sub(1).map_or(0, |r| r * row_bytes + packed);
    if w.len() < need {
        return Err(KernelError::Shape(format!(
            "{rows} rows of {row_bytes} bytes need {need} weight bytes, got {}",
            w.len()
        )));
    }
    Ok(packed)
}

/// Whole rows held by `w`: the last row needs only its packed bytes.
fn rows_in(w: &[u8], row_bytes: usize, packed: usize) -> usize {
    if w.len() < packed || row_bytes == 0 {
        0
    } else {
        (w.len() - packed) / row_bytes + 1
    }
}

fn check_x(x: &[f32], want: usize) -> Result<(), KernelError> {
    if x.len() == want {
        Ok(())
    } else {
        Err(KernelError::Shape(format!(
            "activations hold {} values, expected {want}",
            x.len()
        )))
    }
}

/// `y[r] = dot(W[r], x)` for the `y.len()` rows starting at `w[0]`.
pub fn gemv(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
) -> Result<(), KernelError> {
    let packed = check_rows(ty, w, row_bytes, k, y.len())?;
    check_x(x, k)?;
    gemv_checked(isa.min(Isa::cpu_max()), ty, w, row_bytes, packed, k, x, y);
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn gemv_checked(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    packed: usize,
    k: usize,
    x: &[f32],
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if x86::gemv(isa, ty, w, row_bytes, k, x, y) {
        return;
    }
    let _ = (isa, k);
    scalar::gemv(ty, w, row_bytes, packed, x, y);
}

/// Whether [`gemv_q`] has an integer kernel for `ty` at `isa` (clamped to
/// this CPU). Where it does, it is the fast decode path: as exact as
/// [`gemv`] (see [`QuantX`]) and 2-3x faster on packed types.
pub fn has_gemv_q(isa: Isa, ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa.min(Isa::cpu_max()) >= Isa::Avx2 && x86::has_qkernel(ty)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, ty);
        false
    }
}

/// `y[r] = dot(W[r], x)` with `x` given as [`QuantX`] planes, on the
/// integer kernels. `Ok(false)` (nothing written) where [`has_gemv_q`] is
/// false: use [`gemv`] with the f32 `x`.
pub fn gemv_q(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    qx: &QuantX,
    y: &mut [f32],
) -> Result<bool, KernelError> {
    check_rows(ty, w, row_bytes, qx.len(), y.len())?;
    if qx.is_empty() {
        return Err(KernelError::Shape("empty quantized activations".into()));
    }
    if !has_gemv_q(isa, ty) {
        return Ok(false);
    }
    #[cfg(target_arch = "x86_64")]
    {
        Ok(x86::gemv_q(
            isa.min(Isa::cpu_max()),
            ty,
            w,
            row_bytes,
            qx,
            y,
        ))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Ok(false)
    }
}

/// Rows held by `w`, after checking `w`, `x` and `ldy` for a GEMM of `n`
/// tokens.
fn gemm_rows(
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    n: usize,
    ldy: usize,
) -> Result<usize, KernelError> {
    let packed = check_rows(ty, w, row_bytes, k, 0)?;
    let rows = rows_in(w, row_bytes, packed);
    check_x(x, n * k)?;
    if ldy < rows {
        return Err(KernelError::Shape(format!("ldy {ldy} < {rows} rows")));
    }
    Ok(rows)
}

/// `Y[t][r] = dot(W[r], X[t])` for tokens `t < n` and every row `r` held by
/// `w` (the last row needs only its packed bytes). `x` is `n × k`
/// row-major; `Y[t][r]` is written to `y[t * ldy + r]`, `ldy >= rows`.
/// Allocation-free: the weight tile lives on the stack (about 32 KiB).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    ldy: usize,
) -> Result<(), KernelError> {
    let rows = gemm_rows(ty, w, row_bytes, k, x, n, ldy)?;
    if n > 0 && y.len() < (n - 1) * ldy + rows {
        return Err(KernelError::Shape(format!(
            "output of {} values with ldy {ldy} cannot hold {n} × {rows}",
            y.len()
        )));
    }
    if n == 0 || rows == 0 {
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    {
        let isa = isa.min(Isa::cpu_max());
        let out = x86::Out::Slice(&mut *y);
        // SAFETY: a slice output carries no extra contract.
        if unsafe { x86::gemm(isa, ty, w, row_bytes, rows, k, x, n, out, ldy) } {
            return Ok(());
        }
    }
    let _ = isa;
    scalar::gemm(ty, w, row_bytes, rows, k, x, n, y, ldy);
    Ok(())
}

/// [`gemm`] into the columns of an output that other threads fill too:
/// `Y[t][r]` is written to `y.add(t * ldy + r)` with no staging copy.
/// Only the AMX path writes this way; `Ok(false)` (nothing written) means
/// this batch does not take it, and the caller runs [`gemm`].
///
/// # Safety
/// `y` must be valid for writes at `t * ldy + r` for every token `t < n`
/// and row `r` held by `w`, and nothing else may access those elements
/// during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_shared(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    n: usize,
    y: *mut f32,
    ldy: usize,
) -> Result<bool, KernelError> {
    let rows = gemm_rows(ty, w, row_bytes, k, x, n, ldy)?;
    if n == 0 || rows == 0 {
        return Ok(true);
    }
    #[cfg(target_arch = "x86_64")]
    {
        let isa = isa.min(Isa::cpu_max());
        let out = x86::Out::Shared(y);
        // SAFETY: this function's contract.
        Ok(unsafe { x86::gemm(isa, ty, w, row_bytes, rows, k, x, n, out, ldy) })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, y);
        Ok(false)
    }
}

/// How a caller should batch `gemm` calls of `n` tokens on `isa`:
/// `(tokens per call, rows per call a multiple of)`. The f32 micro-kernel
/// dequantizes each weight row once per call and reads activations a
/// token panel at a time, so up to 256 tokens per call amortize the
/// dequantization (64 cost 10-25% at 512 tokens on Zen 3) while the
/// caller's output block stays in L2; the AMX path repacks every
/// weight row per call, so it wants all tokens at once (and
/// [`gemm_shared`], to skip the staging copy) and row groups of 32.
pub fn gemm_blocking(isa: Isa, n: usize) -> (usize, usize) {
    if gemm_uses_amx(isa, n) {
        (n, 32)
    } else {
        (n.min(256), 16)
    }
}

/// Whether [`gemm`] of `n` tokens on `isa` runs on AMX tiles (and
/// [`gemm_shared`] takes it): [`Isa::Amx`] on this CPU and 48+ tokens.
pub fn gemm_uses_amx(isa: Isa, n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        isa.min(Isa::cpu_max()) == Isa::Amx && n >= x86::AMX_MIN_TOKENS
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, n);
        false
    }
}

/// Index (offset by `start_id`) and value of the largest `dot(W[r], x)`
/// over the rows held by `w`; ties go to the lowest index and NaN dots
/// never win (all-NaN rows give `(start_id, -inf)`). To merge the results
/// of threads that split the rows, take the largest value, then the
/// lowest index. [`argmax_rows_checked`] also reports non-finite dots.
pub fn argmax_rows(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    start_id: usize,
) -> Result<(usize, f32), KernelError> {
    argmax_rows_checked(isa, ty, w, row_bytes, k, x, start_id).map(|m| (m.index, m.value))
}

/// Result of [`argmax_rows_checked`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowMax {
    /// As [`argmax_rows`]: `+inf` can win, NaN never does.
    pub index: usize,
    pub value: f32,
    /// The lowest index (offset by `start_id`) whose dot is NaN or
    /// infinite, with that dot: a greedy head must report it rather than
    /// return a token picked around it.
    pub non_finite: Option<(usize, f32)>,
}

/// [`argmax_rows`] that also finds the first non-finite dot (one compare
/// per row).
pub fn argmax_rows_checked(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    k: usize,
    x: &[f32],
    start_id: usize,
) -> Result<RowMax, KernelError> {
    let packed = check_rows(ty, w, row_bytes, k, 0)?;
    check_x(x, k)?;
    let rows = rows_in(w, row_bytes, packed);
    if rows == 0 {
        return Err(KernelError::Shape("argmax over zero rows".into()));
    }
    let isa = isa.min(Isa::cpu_max());
    // Dots for a chunk of rows land in a stack buffer, then get scanned.
    const CHUNK: usize = 64;
    let mut buf = [0.0f32; CHUNK];
    let mut best = (start_id, f32::NEG_INFINITY);
    let mut non_finite = None;
    for r0 in (0..rows).step_by(CHUNK) {
        let m = CHUNK.min(rows - r0);
        let end = (r0 + m - 1) * row_bytes + packed;
        let ys = &mut buf[..m];
        gemv_checked(
            isa,
            ty,
            &w[r0 * row_bytes..end],
            row_bytes,
            packed,
            k,
            x,
            ys,
        );
        for (i, &v) in ys.iter().enumerate() {
            if v > best.1 {
                best = (start_id + r0 + i, v);
            }
        }
        if non_finite.is_none() {
            non_finite = ys
                .iter()
                .position(|v| !v.is_finite())
                .map(|i| (start_id + r0 + i, ys[i]));
        }
    }
    Ok(RowMax {
        index: best.0,
        value: best.1,
        non_finite,
    })
}

/// Whether [`screen_rows`] handles `ty` (the greedy head's integer
/// screen; see [`ScreenX`]).
pub fn can_screen(ty: GgmlType) -> bool {
    ty == GgmlType::Q8_0
}

/// Screens the `hi.len()` rows starting at `w[0]` for an exact argmax:
/// `hi[r]` is an upper bound on `dot(W[r], x)` as [`gemv`] computes it,
/// and the return value a lower bound on the largest such dot (`NaN` when
/// a bound is not finite: use the exact path). Rows whose `hi` is below
/// the largest lower bound over all rows cannot be, or tie, the argmax;
/// re-score the rest with [`gemv`]. Only Q8_0 ([`can_screen`]).
pub fn screen_rows(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    sx: &ScreenX,
    hi: &mut [f32],
) -> Result<f32, KernelError> {
    if !can_screen(ty) {
        return Err(KernelError::Unsupported(ty));
    }
    check_rows(ty, w, row_bytes, sx.len(), hi.len())?;
    if hi.is_empty() {
        return Ok(f32::NEG_INFINITY);
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(m) = x86::screen_q8_0(isa.min(Isa::cpu_max()), sx, w, row_bytes, hi) {
        return Ok(m);
    }
    let _ = isa;
    Ok(screen::screen_q8_0(sx, w, row_bytes, hi))
}

/// [`screen_rows`] for several activation rows at once, each weight row
/// read once for all of them (a batch's greedy heads): for weight row `r`
/// and activation row `t` of `n = sxs.len()`, `hi[r * n + t]` is an upper
/// bound on `dot(W[r], x_t)` as [`gemv`] computes it, and `lo[t]` is
/// raised to a lower bound on the largest such dot over these rows (`NaN`
/// when a bound is not finite: use the exact path for that `t`). The
/// bounds are as tight as [`screen_rows`]' (the same terms, summed in
/// another order). Only Q8_0 ([`can_screen`]).
pub fn screen_rows_multi(
    isa: Isa,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    sxs: &[ScreenX],
    hi: &mut [f32],
    lo: &mut [f32],
) -> Result<(), KernelError> {
    if !can_screen(ty) {
        return Err(KernelError::Unsupported(ty));
    }
    let n = sxs.len();
    let k = sxs.first().map_or(0, ScreenX::len);
    if n == 0 || lo.len() != n || !hi.len().is_multiple_of(n) || sxs.iter().any(|s| s.len() != k) {
        return Err(KernelError::Shape(format!(
            "{n} screened rows (lengths must agree), {} bounds, {} floors",
            hi.len(),
            lo.len()
        )));
    }
    check_rows(ty, w, row_bytes, k, hi.len() / n)?;
    if hi.is_empty() {
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if x86::screen_q8_0_multi(isa.min(Isa::cpu_max()), sxs, w, row_bytes, hi, lo) {
        return Ok(());
    }
    let _ = isa;
    screen::screen_q8_0_multi(sxs, w, row_bytes, hi, lo);
    Ok(())
}

/// A Q8_0 matrix's rows in tiles of 16, transposed once for the multi-row
/// screen (vocab rows in the lanes of `vpdpbusd`, see
/// [`screen_rows_multi`]), so that screening them skips the per-call
/// transposes. 576 bytes per 16 rows and block of 32 (the rows take 544);
/// the last `rows % 16` rows are not held (screen them from the matrix).
pub struct ScreenTiles {
    #[cfg(target_arch = "x86_64")]
    packed: x86::Packed,
    k: usize,
}

impl ScreenTiles {
    /// `rows` rows of `k` Q8_0 values at `w` (stride `row_bytes`), packed
    /// (6 ms for 262,144 x 640 on Zen 4). `None` where the form does not
    /// run: `isa` below [`Isa::Avx512Vnni`], other types, rows of more
    /// than 5,632 values, or the memory not available.
    pub fn pack(
        isa: Isa,
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        rows: usize,
        k: usize,
    ) -> Option<ScreenTiles> {
        if !can_screen(ty) || k == 0 || check_rows(ty, w, row_bytes, k, rows).is_err() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let packed = x86::pack_screen(isa.min(Isa::cpu_max()), w, row_bytes, rows, k / 32)?;
            Some(ScreenTiles { packed, k })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = isa;
            None
        }
    }

    /// Rows held: the matrix's whole tiles of 16.
    pub fn rows(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        return 16 * self.packed.tiles;
        #[cfg(not(target_arch = "x86_64"))]
        0
    }

    /// Row length.
    pub fn cols(&self) -> usize {
        self.k
    }
}

/// [`screen_rows_multi`] of rows `r0 .. r0 + hi.len() / sxs.len()` of
/// packed tiles (`r0` and the row count multiples of 16, inside
/// [`ScreenTiles::rows`]): the same bounds and floors.
pub fn screen_tiles_multi(
    isa: Isa,
    tiles: &ScreenTiles,
    r0: usize,
    sxs: &[ScreenX],
    hi: &mut [f32],
    lo: &mut [f32],
) -> Result<(), KernelError> {
    let n = sxs.len();
    let rows = hi.len().checked_div(n).unwrap_or(0);
    if n == 0
        || lo.len() != n
        || !hi.len().is_multiple_of(n)
        || sxs.iter().any(|s| s.len() != tiles.k)
        || !r0.is_multiple_of(16)
        || !rows.is_multiple_of(16)
        || r0 + rows > tiles.rows()
    {
        return Err(KernelError::Shape(format!(
            "{n} screened rows of {} (tiles of {}), rows {r0}..+{rows} of {} packed, {} floors",
            sxs.first().map_or(0, ScreenX::len),
            tiles.k,
            tiles.rows(),
            lo.len()
        )));
    }
    #[cfg(target_arch = "x86_64")]
    if x86::screen_packed_multi(isa.min(Isa::cpu_max()), sxs, &tiles.packed, r0 / 16, hi, lo) {
        return Ok(());
    }
    let _ = isa;
    Err(KernelError::Shape(format!(
        "packed screen tiles need AVX-512 VNNI, not {isa}"
    )))
}

/// A Q5_0, Q4_K or Q6_K matrix's rows in tiles of 16 for the tiled
/// integer GEMV ([`gemv_q_tiles`]): as many bytes as the rows (Q4_K: 2.8%
/// more);
/// the last `rows % 16` rows are not held (run them through [`gemv_q`]).
pub struct QTiles {
    #[cfg(target_arch = "x86_64")]
    tiles: x86::qtile::Tiles,
    k: usize,
}

impl QTiles {
    /// Packed on `pool` where given. `None` where the form does not run:
    /// `isa` below [`Isa::Avx512Vnni`], types other than Q5_0, Q4_K and
    /// Q6_K, or the memory not available.
    pub fn pack(
        isa: Isa,
        ty: GgmlType,
        w: &[u8],
        row_bytes: usize,
        rows: usize,
        k: usize,
        pool: Option<&pool::Pool>,
    ) -> Option<QTiles> {
        if !matches!(ty, GgmlType::Q5_0 | GgmlType::Q4K | GgmlType::Q6K)
            || k == 0
            || check_rows(ty, w, row_bytes, k, rows).is_err()
        {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let isa = isa.min(Isa::cpu_max());
            let tiles = x86::pack_qtiles(isa, ty, w, row_bytes, rows, k, pool)?;
            Some(QTiles { tiles, k })
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, pool);
            None
        }
    }

    /// Rows held: the matrix's whole tiles of 16.
    pub fn rows(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        return 16 * self.tiles.tiles;
        #[cfg(not(target_arch = "x86_64"))]
        0
    }
}

/// `y[t * ldy + i]`: row `r0 + i` of the tiles (`i < rows`; `r0` and
/// `rows` multiples of 16 inside [`QTiles::rows`]) against activation `t`
/// of `qxs`, as [`gemv_q`] computes it but for f32 rounding (the planes
/// are folded per block, not per 4 weights).
pub fn gemv_q_tiles(
    isa: Isa,
    tiles: &QTiles,
    r0: usize,
    rows: usize,
    qxs: &[QuantX],
    y: &mut [f32],
    ldy: usize,
) -> Result<(), KernelError> {
    let n = qxs.len();
    if qxs.iter().any(|q| q.len() != tiles.k)
        || !r0.is_multiple_of(16)
        || !rows.is_multiple_of(16)
        || r0 + rows > tiles.rows()
        || ldy < rows
        || (n > 0 && y.len() < (n - 1) * ldy + rows)
    {
        return Err(KernelError::Shape(format!(
            "{n} activations of {:?} values against rows {r0}..+{rows} of tiles of {} x {}, \
             {} outputs at stride {ldy}",
            qxs.first().map(|q| q.len()),
            tiles.rows(),
            tiles.k,
            y.len()
        )));
    }
    if n == 0 || rows == 0 {
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if x86::gemv_qtiles(
        isa.min(Isa::cpu_max()),
        &tiles.tiles,
        r0 / 16,
        rows / 16,
        qxs,
        y,
        ldy,
    ) {
        return Ok(());
    }
    let _ = isa;
    Err(KernelError::Shape(format!(
        "tiled integer GEMV needs AVX-512 VNNI, not {isa}"
    )))
}

/// Checks the shapes of [`dot_rows`] / [`axpy_rows`]; returns `d`.
fn check_row_op(
    q_len: usize,
    g: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    per_head: usize,
    other: usize,
) -> Result<usize, KernelError> {
    if g == 0 || !q_len.is_multiple_of(g) {
        return Err(KernelError::Shape(format!(
            "{q_len} query values do not split into {g} heads"
        )));
    }
    let d = q_len / g;
    let need = n.checked_sub(1).map_or(0, |j| j * stride + d);
    if (n > 1 && stride < d) || m.len() < need || other < g * per_head {
        return Err(KernelError::Shape(format!(
            "{n} rows of {d} with stride {stride} in {} values, {g} heads, output {other}",
            m.len()
        )));
    }
    Ok(d)
}

/// Attention scores: `out[h * n + j] = dot(q[h*d..][..d], m[j*stride..][..d])`
/// for `g` query vectors of `d = q.len() / g` values and `n` rows of `m`.
/// Each row is loaded once for all `g` queries (the heads sharing a KV
/// head), so a K cache is streamed once per group.
#[allow(clippy::too_many_arguments)]
pub fn dot_rows(
    isa: Isa,
    q: &[f32],
    g: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    out: &mut [f32],
) -> Result<(), KernelError> {
    let d = check_row_op(q.len(), g, m, stride, n, n, out.len())?;
    #[cfg(target_arch = "x86_64")]
    if x86::dot_rows(isa.min(Isa::cpu_max()), q, g, d, m, stride, n, out) {
        return Ok(());
    }
    let _ = isa;
    scalar::dot_rows(q, g, d, m, stride, n, out);
    Ok(())
}

/// Attention values: `acc[h*d..][..d] += sum_j p[h * n + j] * m[j*stride..][..d]`
/// for `h < g`, `d = acc.len() / g` (rows as in [`dot_rows`]).
#[allow(clippy::too_many_arguments)]
pub fn axpy_rows(
    isa: Isa,
    p: &[f32],
    g: usize,
    m: &[f32],
    stride: usize,
    n: usize,
    acc: &mut [f32],
) -> Result<(), KernelError> {
    let d = check_row_op(acc.len(), g, m, stride, n, n, p.len())?;
    #[cfg(target_arch = "x86_64")]
    if x86::axpy_rows(isa.min(Isa::cpu_max()), p, g, d, m, stride, n, acc) {
        return Ok(());
    }
    let _ = isa;
    scalar::axpy_rows(p, g, d, m, stride, n, acc);
    Ok(())
}

/// `x[i] = c * tanh(x[i] / c)` (the logit / score softcap). The SIMD
/// levels use a rational `tanh` accurate to a few ulp; NaN stays NaN.
pub fn softcap(isa: Isa, x: &mut [f32], c: f32) {
    #[cfg(target_arch = "x86_64")]
    if x86::softcap(isa.min(Isa::cpu_max()), x, c) {
        return;
    }
    let _ = isa;
    x.iter_mut().for_each(|v| *v = c * (*v / c).tanh());
}

/// `g[i] = gelu_tanh(g[i]) * u[i]` for `i < min(g.len(), u.len())`, with
/// `gelu_tanh(x) = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`.
pub fn gelu_mul(isa: Isa, g: &mut [f32], u: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if x86::gelu_mul(isa.min(Isa::cpu_max()), g, u) {
        return;
    }
    let _ = isa;
    let n = g.len().min(u.len());
    for (a, &b) in g[..n].iter_mut().zip(&u[..n]) {
        *a = scalar::gelu_tanh(*a) * b;
    }
}

/// One online-softmax step over a block of raw attention scores:
/// `x = scale * x`, then `x = cap * tanh(x / cap)` when capped,
/// `mx = max(m, max x)`, `x = exp(x - mx)`; returns `(mx, sum x)`. A NaN
/// score makes `mx` NaN (so it reaches the output). SIMD `exp` is about
/// 2 ulp and flushes scores more than ~87 below the max to ~1e-38.
pub fn softmax_step(isa: Isa, x: &mut [f32], scale: f32, cap: Option<f32>, m: f32) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = x86::softmax_step(isa.min(Isa::cpu_max()), x, scale, cap, m) {
        return r;
    }
    let _ = isa;
    let mut mx = m;
    for v in x.iter_mut() {
        *v *= scale;
        if let Some(c) = cap {
            *v = c * (*v / c).tanh();
        }
        if v.is_nan() || *v > mx {
            mx = *v;
        }
    }
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - mx).exp();
        sum += *v;
    }
    (mx, sum)
}
