//! Writes every kernel translation unit as `OUT_DIR/NAME.cu`, for
//! `KILN_CUDA_SOURCE_DIR` (kernel variants timed with the same binaries on
//! a GPU machine without Rust). With `VARIANT_DIR`, each file of
//! `kernels/` that differs there is replaced by the variant's text in every
//! unit that includes it.
//!
//! cargo run -p kiln-cuda --example dump_kernels -- OUT_DIR [VARIANT_DIR]

use std::path::Path;

/// The files `concat!` builds the units from (src/*.rs), by name.
const FILES: [(&str, &str); 12] = [
    ("common.cuh", include_str!("../kernels/common.cuh")),
    ("quant.cuh", include_str!("../kernels/quant.cuh")),
    ("matmul.cu", include_str!("../kernels/matmul.cu")),
    ("skinny.cu", include_str!("../kernels/skinny.cu")),
    ("stream.cu", include_str!("../kernels/stream.cu")),
    ("qdot.cu", include_str!("../kernels/qdot.cu")),
    ("mma.cu", include_str!("../kernels/mma.cu")),
    ("mma2.cu", include_str!("../kernels/mma2.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("fused.cu", include_str!("../kernels/fused.cu")),
    ("sample.cu", include_str!("../kernels/sample.cu")),
];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(out) = args.first() else {
        eprintln!("usage: dump_kernels OUT_DIR [VARIANT_DIR]");
        std::process::exit(2);
    };
    if let Err(e) = run(Path::new(out), args.get(1).map(Path::new)) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run(out: &Path, variant: Option<&Path>) -> Result<(), String> {
    let mut swaps = Vec::new();
    if let Some(dir) = variant {
        for (name, text) in FILES {
            let path = dir.join(name);
            if !path.exists() {
                continue;
            }
            let new =
                std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
            if new != text {
                swaps.push((name, text, new));
            }
        }
        if swaps.is_empty() {
            return Err(format!(
                "{}: no kernel file differs from the built-in ones",
                dir.display()
            ));
        }
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for (name, text) in kiln_cuda::kernel_sources() {
        let mut unit = text.to_string();
        for (file, old, new) in &swaps {
            // Each file appears at most once in a unit (src/*.rs concat!s).
            if unit.contains(old) {
                unit = unit.replacen(old, new, 1);
                eprintln!("{name}: {file} from the variant");
            }
        }
        let path = out.join(format!("{name}.cu"));
        std::fs::write(&path, unit).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
