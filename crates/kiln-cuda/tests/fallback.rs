//! A kernel that fails to compile makes `CudaBackend::new` fail with
//! NVRTC's message, never a panic, so a caller can fall back to the CPU
//! (forced with `KILN_CUDA_FAIL_COMPILE=1`; alone in this binary because it
//! sets the variable). Needs a GPU, else one skip line.

mod common;

#[test]
fn failed_kernel_compile_is_a_clear_error() {
    if common::backend().is_none() {
        return;
    }
    // SAFETY (edition 2021: safe): no other test runs in this binary.
    std::env::set_var("KILN_CUDA_FAIL_COMPILE", "1");
    let err = kiln_cuda::CudaBackend::new(0).expect_err("forced compile failure");
    std::env::remove_var("KILN_CUDA_FAIL_COMPILE");
    let msg = err.to_string();
    println!("{msg}");
    assert!(
        msg.starts_with("backend: compiling elementwise.cu for sm_"),
        "{msg}"
    );
    assert!(msg.contains("forced by KILN_CUDA_FAIL_COMPILE"), "{msg}");
    // Unforced, the same device opens again (the cache was not poisoned).
    kiln_cuda::CudaBackend::new(0).expect("opens once compilation works");
}
