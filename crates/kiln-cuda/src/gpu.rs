//! The device: one context, one stream, a cuBLAS handle, and kernels
//! compiled by NVRTC for this GPU on first use (cubin cached on disk).
//!
//! cudarc loads libcuda, libnvrtc and libcublas at run time and panics when
//! one is missing, so every first touch of a library is probed or guarded
//! here: no panic leaves this crate.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CString};
use std::fmt::Display;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, ValidAsZeroBits,
};
use cudarc::nvrtc::{result as nvrtc, sys as nvrtc_sys, Ptx};
use kiln_model::{ModelError, Result};
use sha2::{Digest, Sha256};

use crate::profile::{profile_enabled, Profile};

/// One CUDA C translation unit. NVRTC has no include path here, so `text`
/// is the headers and the `.cu` file concatenated (`concat!` of
/// `include_str!`s). `name` identifies it in the module cache: unique per
/// source.
pub(crate) struct Source {
    pub name: &'static str,
    pub text: &'static str,
}

/// A [`ModelError::Backend`] saying what failed and why.
pub(crate) fn cuda_err(what: &str, e: impl Display) -> ModelError {
    ModelError::Backend(format!("{what}: {e}"))
}

/// Runs `f`, turning a panic (cudarc's loader panics on a missing library
/// or symbol) into an error about `what`.
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("panic");
        Err(ModelError::Backend(format!("{what}: {msg}")))
    })
}

/// The environment variable `name` where it is a number that `ok`
/// accepts, else `default` (the A/B switches of the kernels' geometry).
pub(crate) fn env_number(name: &str, ok: impl Fn(usize) -> bool, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| ok(n))
        .unwrap_or(default)
}

/// Whether libcuda can be loaded.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library names cudarc would use.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether libnvrtc can be loaded.
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: as in `driver_present`.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// Whether libcublas can be loaded.
fn cublas_present() -> bool {
    // SAFETY: as in `driver_present`.
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// GPUs the driver reports; an error when there is no driver or it fails
/// to initialise.
pub(crate) fn count_devices() -> Result<usize> {
    if !driver_present() {
        return Err(ModelError::Backend(
            "no CUDA driver (libcuda.so not found)".into(),
        ));
    }
    guarded("CUDA driver", || {
        CudaContext::device_count()
            .map(|n| n.max(0) as usize)
            .map_err(|e| cuda_err("CUDA driver failed to initialise", e))
    })
}

/// A kernel source compiling on a thread of its own: its cubin.
type Compile = JoinHandle<Result<Vec<u8>>>;

/// The context, stream and kernels of one GPU.
pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    /// NVRTC target, e.g. `sm_90`.
    arch: String,
    name: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    /// Sources [`Gpu::prepare`] has seen, with the compile it started
    /// ahead of first use (none where the cache holds the cubin).
    compiling: Mutex<HashMap<&'static str, Option<Compile>>>,
    functions: Mutex<HashMap<(&'static str, String), CudaFunction>>,
    /// A graph capture is in progress on `stream`: no allocation, no host
    /// copy, no sync may happen (see [`Gpu::check_not_capturing`]).
    capturing: AtomicBool,
    /// Bumped whenever a backend-internal workspace is reallocated:
    /// captured graphs hold its old address, so they are dropped.
    workspace_generation: AtomicU64,
    pub(crate) counters: Counters,
    /// Device time per kernel under `KILN_CUDA_PROFILE=1` (profile.rs).
    pub(crate) profile: Profile,
}

/// Work the backend enqueued, counted for the graph-replay test and the
/// launches-per-token figure.
#[derive(Default)]
pub(crate) struct Counters {
    pub kernel_launches: AtomicU64,
    pub graph_launches: AtomicU64,
    pub graph_captures: AtomicU64,
    pub host_to_device: AtomicU64,
    pub device_to_host: AtomicU64,
    /// Nanoseconds the host spent in device→host copies (mostly waiting
    /// for the work before them): a step's wall time minus this is its
    /// host time.
    pub download_ns: AtomicU64,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        if profile_enabled() {
            eprint!("{}", self.profile.report());
        }
    }
}

impl Counters {
    pub(crate) fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

impl Gpu {
    /// Opens device `ordinal` (checked against the count by the caller).
    pub(crate) fn new(ordinal: usize) -> Result<Gpu> {
        if !nvrtc_present() {
            return Err(ModelError::Backend(
                "no NVRTC (libnvrtc.so not found): the CUDA kernels are compiled at run time"
                    .into(),
            ));
        }
        if !cublas_present() {
            return Err(ModelError::Backend(
                "no cuBLAS (libcublas.so not found)".into(),
            ));
        }
        guarded("CUDA initialisation", || {
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| cuda_err(&format!("opening CUDA device {ordinal}"), e))?;
            // One stream orders everything, so cudarc's per-buffer events
            // (a record and a wait around every launch, and host calls a
            // graph capture cannot hold) are pure overhead.
            // SAFETY: all work goes to the one stream created below.
            unsafe { ctx.disable_event_tracking() };
            let (major, minor) = ctx
                .compute_capability()
                .map_err(|e| cuda_err("reading the compute capability", e))?;
            let name = ctx
                .name()
                .map_err(|e| cuda_err("reading the device name", e))?;
            let stream = ctx
                .new_stream()
                .map_err(|e| cuda_err("creating a CUDA stream", e))?;
            let blas = CudaBlas::new(stream.clone()).map_err(|e| cuda_err("creating cuBLAS", e))?;
            // Pure f32 SGEMM (no TF32): logits must stay within 1e-3 of
            // the exact reference.
            // SAFETY: the handle is live; the mode is a valid enum value.
            unsafe {
                cudarc::cublas::sys::cublasSetMathMode(
                    *blas.handle(),
                    cudarc::cublas::sys::cublasMath_t::CUBLAS_PEDANTIC_MATH,
                )
            }
            .result()
            .map_err(|e| cuda_err("setting cuBLAS to pure f32 math", e))?;
            Ok(Gpu {
                ctx,
                stream,
                blas,
                arch: format!("sm_{major}{minor}"),
                name,
                modules: Mutex::default(),
                compiling: Mutex::default(),
                functions: Mutex::default(),
                capturing: AtomicBool::new(false),
                workspace_generation: AtomicU64::new(0),
                counters: Counters::default(),
                profile: Profile::default(),
            })
        })
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Device address of element `offset` of `s`, as a kernel argument.
    pub(crate) fn ptr<T>(&self, s: &CudaSlice<T>, offset: usize) -> u64 {
        // Event tracking is off (see `Gpu::new`): the guard does nothing.
        let (p, _guard) = s.device_ptr(&self.stream);
        p + (offset * std::mem::size_of::<T>()) as u64
    }

    /// Copies `src` to the start of `dst` (enqueued; `src` may be reused
    /// at once).
    pub(crate) fn upload<T: DeviceRepr>(
        &self,
        src: &[T],
        dst: &mut CudaSlice<T>,
        what: &str,
    ) -> Result<()> {
        self.check_not_capturing(&format!("copying {what} to the device"))?;
        if src.len() > dst.len() {
            return Err(ModelError::Backend(format!(
                "copying {what}: {} values into a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        if src.is_empty() {
            return Ok(());
        }
        Counters::bump(&self.counters.host_to_device);
        self.stream
            .memcpy_htod(src, &mut dst.slice_mut(..src.len()))
            .map_err(|e| cuda_err(&format!("copying {what} to the device"), e))
    }

    /// Copies `out.len()` values of `src` from `offset` to the host, after
    /// everything enqueued before (a kernel's failure surfaces here).
    pub(crate) fn download<T: DeviceRepr>(
        &self,
        src: &CudaSlice<T>,
        offset: usize,
        out: &mut [T],
        what: &str,
    ) -> Result<()> {
        self.check_not_capturing(&format!("copying {what} to the host"))?;
        if offset + out.len() > src.len() {
            return Err(ModelError::Backend(format!(
                "copying {what}: values {offset}..{} of a buffer of {}",
                offset + out.len(),
                src.len()
            )));
        }
        if out.is_empty() {
            return Ok(());
        }
        Counters::bump(&self.counters.device_to_host);
        let t = std::time::Instant::now();
        let r = self
            .stream
            .memcpy_dtoh(&src.slice(offset..offset + out.len()), out)
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| cuda_err(&format!("copying {what} to the host"), e));
        let ns = u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.counters.download_ns.fetch_add(ns, Ordering::Relaxed);
        r
    }

    /// Enqueues kernel `f` with `cfg` and `params` (pointers to each
    /// argument's value, in order) as a programmatic dependent launch: it
    /// may start while the previous kernel finishes, and waits for it in
    /// `grid_dep_wait()` (kernels/common.cuh), which every kernel launched
    /// this way must call before touching memory another kernel wrote.
    /// Inside a graph this hides most of each launch's latency.
    /// `KILN_CUDA_PDL=0` launches plainly instead.
    ///
    /// # Safety
    /// `params` must match the kernel's parameters and stay valid for the
    /// call; every buffer it touches must hold what `cfg`'s threads index.
    pub(crate) unsafe fn launch_pdl(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
        what: &str,
    ) -> Result<()> {
        use cudarc::driver::sys;
        Counters::bump(&self.counters.kernel_launches);
        self.ctx
            .bind_to_thread()
            .map_err(|e| cuda_err(&format!("launching {what}"), e))?;
        // SAFETY: a zeroed attribute is a valid value of the union.
        let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(pdl_enabled()),
        };
        self.timed(what, || {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
            .map_err(|e| cuda_err(&format!("launching {what}"), e))
        })
    }

    /// Runs `enqueue` (device work on the stream), timed under
    /// `KILN_CUDA_PROFILE=1` outside captures.
    pub(crate) fn timed<T>(&self, what: &str, enqueue: impl FnOnce() -> Result<T>) -> Result<T> {
        if !profile_enabled() || self.capturing.load(Ordering::SeqCst) {
            return enqueue();
        }
        let start = Profile::mark(&self.stream);
        let r = enqueue();
        self.profile
            .record(what, start, Profile::mark(&self.stream));
        r
    }

    pub(crate) fn set_capturing(&self, on: bool) {
        self.capturing.store(on, Ordering::SeqCst);
    }

    /// An error if a graph capture is in progress: `what` (an allocation,
    /// a host copy) cannot be part of a graph.
    pub(crate) fn check_not_capturing(&self, what: &str) -> Result<()> {
        if self.capturing.load(Ordering::SeqCst) {
            return Err(ModelError::Backend(format!(
                "{what} inside a captured step (only device work may be captured)"
            )));
        }
        Ok(())
    }

    /// Call after reallocating a backend-internal workspace (never while
    /// capturing): graphs captured with the old one are dropped.
    pub(crate) fn workspace_reallocated(&self) {
        self.workspace_generation.fetch_add(1, Ordering::SeqCst);
    }

    pub(crate) fn workspace_generation(&self) -> u64 {
        self.workspace_generation.load(Ordering::SeqCst)
    }

    /// `len` zeroed values on the device; out of memory is an error that
    /// says what did not fit and how much was free.
    pub(crate) fn alloc<T: DeviceRepr + ValidAsZeroBits>(
        &self,
        len: usize,
        what: &str,
    ) -> Result<CudaSlice<T>> {
        self.check_not_capturing(&format!("allocating {what}"))?;
        self.stream.alloc_zeros::<T>(len).map_err(|e| {
            let bytes = len * std::mem::size_of::<T>();
            let free = match self.ctx.mem_get_info() {
                Ok((free, total)) => format!("{} MiB of {} MiB free", free >> 20, total >> 20),
                Err(_) => "free memory unknown".into(),
            };
            cuda_err(
                &format!(
                    "allocating {what} ({bytes} bytes) on {} ({free})",
                    self.name
                ),
                e,
            )
        })
    }

    /// The kernel `name` of `src`, compiling and loading the source on
    /// first use.
    pub(crate) fn function(&self, src: &Source, name: &str) -> Result<CudaFunction> {
        let mut functions = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = functions.get(&(src.name, name.to_string())) {
            return Ok(f.clone());
        }
        let module = self.module(src)?;
        let f = module
            .load_function(name)
            .map_err(|e| cuda_err(&format!("kernel {name} of {}.cu", src.name), e))?;
        functions.insert((src.name, name.to_string()), f.clone());
        Ok(f)
    }

    /// Starts compiling `src` on a thread of its own unless it is loaded,
    /// cached or already started, so the units a model needs compile side
    /// by side (one NVRTC run is single-threaded and the matmul units take
    /// tens of seconds each) while its weights upload; [`Gpu::function`]
    /// then waits for the result instead of compiling. Errors surface
    /// there, as if compiled then.
    pub(crate) fn prepare(&self, src: &Source) {
        if self
            .modules
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains_key(src.name)
        {
            return;
        }
        // Seen once per source: every weight upload asks, and hashing the
        // source for its cache path is not free.
        let mut compiling = self.compiling.lock().unwrap_or_else(|e| e.into_inner());
        if compiling.contains_key(src.name) {
            return;
        }
        // A forced failure (tests) stays on the caller's thread: no compile
        // outlives the backend that failed, or the variable's removal.
        if forced_compile_failure() || cache_path(src, &self.arch).is_ok_and(|p| p.exists()) {
            compiling.insert(src.name, None);
            return;
        }
        let (name, text, arch) = (src.name, src.text, self.arch.clone());
        let handle = std::thread::Builder::new()
            .name(format!("nvrtc {name}"))
            .spawn(move || {
                let src = Source { name, text };
                let cubin = compile(&src, &arch)?;
                if let Ok(path) = cache_path(&src, &arch) {
                    store_cache(&path, &cubin);
                }
                Ok(cubin)
            });
        // No thread to be had: the compile happens at first use instead.
        compiling.insert(name, handle.ok());
    }

    fn module(&self, src: &Source) -> Result<Arc<CudaModule>> {
        let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = modules.get(src.name) {
            return Ok(m.clone());
        }
        let cached = cache_path(src, &self.arch)?;
        let loaded = std::fs::read(&cached)
            .ok()
            .filter(|_| !forced_compile_failure())
            .and_then(|cubin| self.ctx.load_module(Ptx::from_binary(cubin)).ok());
        let module = match loaded {
            Some(m) => m,
            None => {
                let started = self
                    .compiling
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(src.name)
                    .flatten();
                let cubin = match started {
                    Some(h) => h.join().unwrap_or_else(|_| {
                        Err(ModelError::Backend(format!(
                            "compiling {}.cu: panicked",
                            src.name
                        )))
                    })?,
                    None => compile(src, &self.arch)?,
                };
                let m = self
                    .ctx
                    .load_module(Ptx::from_binary(cubin.clone()))
                    .map_err(|e| {
                        cuda_err(&format!("loading {}.cu for {}", src.name, self.arch), e)
                    })?;
                if !cached.exists() {
                    store_cache(&cached, &cubin);
                }
                m
            }
        };
        modules.insert(src.name, module.clone());
        Ok(module)
    }
}

/// `KILN_CUDA_PDL=0` turns programmatic dependent launches off (for
/// triage and timing).
fn pdl_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("KILN_CUDA_PDL").map_or(true, |v| v.trim() != "0"))
}

/// NVRTC options besides the architecture. Precise division and square
/// root (the defaults) keep the ops within rounding of the CPU's.
const NVRTC_OPTIONS: [&str; 2] = ["-std=c++17", "--fmad=true"];

/// NVRTC's `(major, minor)` version.
fn nvrtc_version() -> Result<(i32, i32)> {
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: two valid out-pointers.
    unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| cuda_err("reading the NVRTC version", e))?;
    Ok((major, minor))
}

/// `$KILN_CACHE_DIR/cuda` (default `~/.cache/kiln/cuda`).
fn cache_dir() -> PathBuf {
    let base = match std::env::var_os("KILN_CACHE_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into()))
            .join(".cache/kiln"),
    };
    base.join("cuda")
}

/// Where the cubin of `src` for `arch` is cached: named by a hash of the
/// source, the target, the options and the compiler version.
fn cache_path(src: &Source, arch: &str) -> Result<PathBuf> {
    let (major, minor) = nvrtc_version()?;
    let mut h = Sha256::new();
    h.update(source_text(src).as_bytes());
    h.update(format!("\0{arch}\0{NVRTC_OPTIONS:?}\0nvrtc {major}.{minor}").as_bytes());
    let hex: String = h.finalize()[..12]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok(cache_dir().join(format!("{}-{arch}-{hex}.cubin", src.name)))
}

/// Writes a compiled cubin to the cache. A failure only costs a compile
/// next time, so it is not an error (a read-only home is common on
/// GPU machines).
fn store_cache(path: &PathBuf, cubin: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    // Rename into place so a concurrent reader never sees half a file.
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    if std::fs::write(&tmp, cubin).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Compiles `src` for `arch` (`sm_90`: a cubin; `compute_90`: PTX) and
/// returns the image. Errors carry NVRTC's log.
pub(crate) fn compile(src: &Source, arch: &str) -> Result<Vec<u8>> {
    if !nvrtc_present() {
        return Err(ModelError::Backend(
            "no NVRTC (libnvrtc.so not found)".into(),
        ));
    }
    guarded(&format!("NVRTC on {}.cu", src.name), || {
        compile_unguarded(src, arch)
    })
}

/// The text compiled for `src`: the built-in one, or
/// `$KILN_CUDA_SOURCE_DIR/<name>.cu` where that variable is set and the
/// file exists (a whole translation unit, headers included: for timing
/// kernel variants with the same binaries on a GPU machine without Rust).
fn source_text(src: &Source) -> std::borrow::Cow<'static, str> {
    let Some(dir) = std::env::var_os("KILN_CUDA_SOURCE_DIR") else {
        return src.text.into();
    };
    match std::fs::read_to_string(PathBuf::from(dir).join(format!("{}.cu", src.name))) {
        Ok(text) => text.into(),
        Err(_) => src.text.into(),
    }
}

/// `KILN_CUDA_FAIL_COMPILE=1` makes every kernel source fail to compile
/// (an `#error` line first), bypassing the cache: for testing the paths
/// that must survive a broken kernel.
fn forced_compile_failure() -> bool {
    std::env::var("KILN_CUDA_FAIL_COMPILE").is_ok_and(|v| v.trim() == "1")
}

fn compile_unguarded(src: &Source, arch: &str) -> Result<Vec<u8>> {
    let what = format!("compiling {}.cu for {arch}", src.name);
    let text = if forced_compile_failure() {
        format!(
            "#error forced by KILN_CUDA_FAIL_COMPILE=1\n{}",
            source_text(src)
        )
    } else {
        source_text(src).into_owned()
    };
    let text = CString::new(text).map_err(|e| cuda_err(&what, e))?;
    let file = CString::new(format!("{}.cu", src.name)).map_err(|e| cuda_err(&what, e))?;
    let prog = nvrtc::create_program(&text, Some(&file)).map_err(|e| cuda_err(&what, e))?;
    let mut options = vec![format!("--gpu-architecture={arch}")];
    options.extend(NVRTC_OPTIONS.iter().map(|s| s.to_string()));
    // SAFETY: `prog` is live until destroyed at the end of this block.
    let out = unsafe {
        let compiled = nvrtc::compile_program(prog, &options);
        let out = match compiled {
            Ok(()) => image(prog, arch.starts_with("sm_")).map_err(|e| cuda_err(&what, e)),
            Err(e) => {
                let log = nvrtc::get_program_log(prog)
                    .map(|l| c_chars_to_string(&l))
                    .unwrap_or_default();
                Err(cuda_err(&what, format!("{e}\n{log}")))
            }
        };
        let _ = nvrtc::destroy_program(prog);
        out
    };
    out
}

/// The compiled cubin (or PTX) of `prog`.
///
/// # Safety
/// `prog` must be a live, compiled program.
unsafe fn image(
    prog: nvrtc_sys::nvrtcProgram,
    cubin: bool,
) -> std::result::Result<Vec<u8>, nvrtc::NvrtcError> {
    if !cubin {
        return nvrtc::get_ptx(prog).map(|p| p.iter().map(|&c| c as u8).collect());
    }
    let mut size = 0usize;
    nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size).result()?;
    let mut bytes = vec![0u8; size];
    nvrtc_sys::nvrtcGetCUBIN(prog, bytes.as_mut_ptr() as *mut c_char).result()?;
    Ok(bytes)
}

fn c_chars_to_string(s: &[c_char]) -> String {
    let bytes: Vec<u8> = s
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
