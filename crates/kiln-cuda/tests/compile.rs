//! Every kernel source compiles with NVRTC (no GPU needed: PTX for a
//! virtual architecture). Run with NVRTC on the library path, e.g.
//! `LD_LIBRARY_PATH=/opt/nvrtc/nvidia/cu13/lib`.

#[test]
fn every_kernel_source_compiles() {
    if !kiln_cuda::nvrtc_present() {
        println!("skipped: no NVRTC (libnvrtc.so not found)");
        return;
    }
    // compute_75: pre-Ampere GPUs load the same sources (mma.cu's
    // tensor-core bodies compile to nothing there; the host never runs them).
    for arch in ["compute_75", "compute_90", "sm_90"] {
        let built = kiln_cuda::compile_kernel_sources(arch).unwrap_or_else(|e| panic!("{e}"));
        // elementwise, fused, attention, sample and matmul for each of the
        // 13 types.
        assert_eq!(built.len(), 17, "{built:?}");
        for (name, bytes) in built {
            assert!(bytes > 0, "{name} for {arch}: empty image");
        }
    }
}
