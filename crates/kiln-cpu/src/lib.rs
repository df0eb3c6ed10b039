//! CPU backend: packed-weight kernels and fused ops.
