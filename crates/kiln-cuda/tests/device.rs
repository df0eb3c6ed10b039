//! Opening a device: a clear error, never a panic, with or without a
//! driver and a GPU.

use kiln_cuda::{device_count, CudaBackend};

#[test]
fn missing_device_is_a_clear_error() {
    let n = device_count();
    let err = CudaBackend::new(n).expect_err("ordinal past the last device");
    let msg = err.to_string();
    match kiln_cuda::unavailable_reason() {
        Some(reason) if n == 0 => {
            println!("no CUDA device ({reason}): checking the error only");
            assert!(
                msg.contains("no CUDA driver (libcuda.so not found)")
                    || msg.contains("not found (0 present)")
                    || msg.contains("CUDA driver failed"),
                "{msg}"
            );
        }
        _ => assert_eq!(
            msg,
            format!("backend: CUDA device {n} not found ({n} present)")
        ),
    }
}

#[test]
fn opens_every_present_device() {
    for ordinal in 0..device_count() {
        let b = CudaBackend::new(ordinal).expect("present device opens");
        assert!(!b.device_name().is_empty());
        let (free, total) = b.memory_info().expect("memory info");
        assert!(free <= total && total > 0);
    }
}
