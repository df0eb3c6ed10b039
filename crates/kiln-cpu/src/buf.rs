//! The backend's activation buffer: f32s aligned to a 64-byte cache line.
//!
//! The kernels load activations a vector at a time; from a buffer that
//! starts mid-line (a plain `Vec<f32>` is only 16-byte aligned by the
//! allocator) every AVX-512 load straddles two lines. On the real model
//! that made 512-token prefill ~20% slower, by an amount that depended on
//! where the allocator happened to put each buffer.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use kiln_model::{ModelError, Result};

/// Alignment of every buffer: one cache line, one AVX-512 vector.
const ALIGN: usize = 64;

/// A zero-initialised, fixed-length f32 buffer whose first element is
/// [`ALIGN`]-byte aligned; derefs to `[f32]`.
pub struct CpuBuf {
    ptr: NonNull<f32>,
    len: usize,
}

// SAFETY: `CpuBuf` owns its allocation exclusively, like a `Vec<f32>`.
unsafe impl Send for CpuBuf {}
// SAFETY: shared access only reads, like `&[f32]`.
unsafe impl Sync for CpuBuf {}

impl CpuBuf {
    fn layout(len: usize) -> Result<Layout> {
        len.checked_mul(std::mem::size_of::<f32>())
            .and_then(|bytes| Layout::from_size_align(bytes, ALIGN).ok())
            .ok_or_else(|| ModelError::Backend(format!("a buffer of {len} f32s is too large")))
    }

    /// `len` zeros.
    pub fn zeroed(len: usize) -> Result<CpuBuf> {
        let layout = Self::layout(len)?;
        if layout.size() == 0 {
            return Ok(CpuBuf {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw.cast::<f32>()).ok_or_else(|| {
            ModelError::Backend(format!("out of memory for a buffer of {len} f32s"))
        })?;
        Ok(CpuBuf { ptr, len })
    }

    /// A copy of `data`.
    pub fn from_slice(data: &[f32]) -> Result<CpuBuf> {
        let mut b = Self::zeroed(data.len())?;
        b.copy_from_slice(data);
        Ok(b)
    }
}

impl Drop for CpuBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            let layout = Self::layout(self.len).expect("the layout it was allocated with");
            // SAFETY: allocated in `zeroed` with this very layout.
            unsafe { dealloc(self.ptr.as_ptr().cast(), layout) };
        }
    }
}

impl std::ops::Deref for CpuBuf {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        // SAFETY: `len` initialised (zeroed) f32s owned by `self`, or a
        // dangling aligned pointer with length 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for CpuBuf {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for CpuBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBuf").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_copied() {
        for len in [0, 1, 3, 16, 1000, 100_000] {
            let mut b = CpuBuf::zeroed(len).unwrap();
            assert_eq!(b.len(), len);
            assert!(b.iter().all(|&x| x == 0.0));
            if len > 0 {
                assert_eq!(b.as_ptr() as usize % ALIGN, 0);
                b[len - 1] = 2.5;
            }
            let c = CpuBuf::from_slice(&b).unwrap();
            assert_eq!(&c[..], &b[..]);
        }
        assert!(CpuBuf::zeroed(usize::MAX / 2).is_err());
    }
}
