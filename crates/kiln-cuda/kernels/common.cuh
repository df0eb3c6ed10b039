// Shared by every Kiln CUDA source (prepended to each by the Rust side:
// NVRTC gets no include path). Integer names, warp and block reductions.
// Everything here is f32 unless named otherwise.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef short i16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

#ifndef INFINITY // NVRTC has no <math.h>
#define INFINITY __int_as_float(0x7f800000)
#endif

#define WARP 32
#define FULL_MASK 0xffffffffu

// Programmatic dependent launch (Gpu::launch_pdl): a kernel may start
// before the one before it has finished. grid_dep_wait() blocks until that
// kernel has completed and its writes are visible: call it before touching
// memory a previous kernel wrote. grid_dep_launch() lets the next kernel
// start its own launch now (it still waits for this one to complete).
// Both are no-ops in a plain launch.
__device__ __forceinline__ void grid_dep_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void grid_dep_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Both, at the top of a kernel whose inputs all come from before it.
#define KERNEL_PROLOGUE() \
    do {                  \
        grid_dep_wait();  \
        grid_dep_launch(); \
    } while (0)

// Element i of n for each thread of a grid-stride launch.
#define GRID_STRIDE(i, n) for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)

// Sum over the 32 lanes, in every lane.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Max over the 32 lanes, in every lane. A NaN lane makes the result NaN
// (fmaxf would drop it), so a poisoned value reaches the output.
__device__ __forceinline__ float nan_max(float a, float b) {
    return (a != a || a > b) ? a : b;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = nan_max(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned
// to every thread. `scratch` holds 32 values; the block must call it
// together.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const int n_warps = blockDim.x / WARP;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads(); // `scratch` may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : T(0);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// GELU, tanh form, as the CPU's scalar twin: x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
__device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978846f; // sqrt(2/pi), the CPU's f32 constant
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// c * tanh(x / c)
__device__ __forceinline__ float softcap(float x, float c) {
    return c * tanhf(x / c);
}
