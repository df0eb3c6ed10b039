//! Which device runs the model: `--device cpu|cuda|cuda:N|auto`, resolved
//! into an [`AnyBackend`]. This crate is the one place where the CUDA
//! backend is registered next to the CPU one; the model, the runtime and
//! the server see only a [`kiln_model::Backend`].

mod any;

use std::fmt;
use std::str::FromStr;

pub use crate::any::{AnyBackend, AnyBuf, AnyStep, AnyWeight};
use kiln_cpu::CpuBackend;
use kiln_cuda::CudaBackend;
use kiln_model::Result;

/// A device choice as a user gives it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The first CUDA GPU when a driver and a GPU are present, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// CUDA device `N` (ordinal, as `nvidia-smi` lists them).
    Cuda(usize),
}

impl FromStr for Device {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n
                    .parse()
                    .map(Device::Cuda)
                    .map_err(|_| format!("`{s}`: expected cuda:N with N a device number")),
                None => Err(format!("`{s}`: expected cpu, cuda, cuda:N or auto")),
            },
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Auto => f.write_str("auto"),
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// An opened device: the backend and a line saying what was picked and
/// why (for stderr).
pub struct Opened {
    pub backend: AnyBackend,
    pub description: String,
}

impl Device {
    /// Opens the device; `threads` sizes the CPU kernels' pool (0 = one
    /// per core). `auto` never fails for want of a GPU: it falls back to
    /// the CPU and says why.
    pub fn open(self, threads: usize) -> Result<Opened> {
        let cpu = |why: String| {
            let b = CpuBackend::with_threads(threads);
            let description = format!(
                "device: CPU ({}, {} threads){why}",
                b.isa().name(),
                b.threads()
            );
            Opened {
                backend: AnyBackend::Cpu(b),
                description,
            }
        };
        match self {
            Device::Cpu => Ok(cpu(String::new())),
            Device::Cuda(n) => Ok(cuda(CudaBackend::new(n)?, n)),
            Device::Auto => match kiln_cuda::device_count() {
                0 => Ok(cpu(" — no CUDA GPU found".into())),
                _ => match CudaBackend::new(0) {
                    Ok(b) => Ok(cuda(b, 0)),
                    Err(e) => Ok(cpu(format!(" — CUDA device 0 unusable: {e}"))),
                },
            },
        }
    }
}

fn cuda(b: CudaBackend, n: usize) -> Opened {
    let description = format!("device: CUDA {n} ({})", b.device_name());
    Opened {
        backend: AnyBackend::Cuda(Box::new(b)),
        description,
    }
}

#[cfg(test)]
mod tests {
    use super::Device;

    #[test]
    fn device_names_parse_and_print_back() {
        for (s, d) in [
            ("auto", Device::Auto),
            ("cpu", Device::Cpu),
            ("CUDA", Device::Cuda(0)),
            ("cuda:3", Device::Cuda(3)),
        ] {
            assert_eq!(s.parse::<Device>(), Ok(d));
        }
        assert_eq!(Device::Cuda(2).to_string(), "cuda:2");
        for bad in ["tpu", "cuda:", "cuda:x", "cuda:-1", ""] {
            let e = bad.parse::<Device>().unwrap_err();
            assert!(e.contains("expected"), "{bad}: {e}");
        }
    }
}
