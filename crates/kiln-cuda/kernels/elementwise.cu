// Elementwise and per-row ops on f32 activations: RMS norm, add, scale,
// GELU-gate, softcap, strided copy, NEOX RoPE and the KV-cache store.
// Each mirrors the CPU backend's op (crates/kiln-cpu/src/lib.rs) in
// arithmetic order. Positions and cached lengths are read from the step's
// device buffers, so a captured graph replays with new ones.

// --- RMS norm ---------------------------------------------------------------
// x[g] = x[g] / sqrt(mean(x[g]^2) + eps) * w   for each group g of `dim`
// values. The sum of squares is f64, as on the CPU (residual rows reach
// |x| ~ 1e4). Block (threads per group, groups per block): a group's
// threads each take a few values (float4s when V4), so every load of the
// group is in flight at once; the second pass re-reads them from L1.
template <bool V4>
__device__ void rms_norm_impl(float* x, const float* w, u32 n_groups, u32 dim, float eps) {
    __shared__ double partial[32]; // one per warp of the block
    const u32 tpg = blockDim.x, wpg = tpg / WARP;
    const u32 g = blockIdx.x * blockDim.y + threadIdx.y;
    const u32 lane = threadIdx.x % WARP, wig = threadIdx.x / WARP;
    const bool live = g < n_groups;
    float* row = x + (u64)(live ? g : 0) * dim;
    double ss = 0.0;
    if (live) {
        if (V4) {
            for (u32 i = 4 * threadIdx.x; i < dim; i += 4 * tpg) {
                const float4 v = *reinterpret_cast<const float4*>(row + i);
                ss += (double)v.x * v.x + (double)v.y * v.y + (double)v.z * v.z + (double)v.w * v.w;
            }
        } else {
            for (u32 i = threadIdx.x; i < dim; i += tpg) ss += (double)row[i] * (double)row[i];
        }
    }
    ss = warp_sum_f64(ss);
    if (lane == 0) partial[threadIdx.y * wpg + wig] = ss;
    __syncthreads();
    if (!live) return;
    ss = 0.0;
    for (u32 k = 0; k < wpg; ++k) ss += partial[threadIdx.y * wpg + k];
    const float inv = (float)(1.0 / sqrt(ss / (double)dim + (double)eps));
    if (V4) {
        for (u32 i = 4 * threadIdx.x; i < dim; i += 4 * tpg) {
            float4 v = *reinterpret_cast<float4*>(row + i);
            if (w) {
                const float4 s = *reinterpret_cast<const float4*>(w + i);
                v.x = v.x * inv * s.x; v.y = v.y * inv * s.y; v.z = v.z * inv * s.z; v.w = v.w * inv * s.w;
            } else {
                v.x *= inv; v.y *= inv; v.z *= inv; v.w *= inv;
            }
            *reinterpret_cast<float4*>(row + i) = v;
        }
    } else {
        for (u32 i = threadIdx.x; i < dim; i += tpg) row[i] = w ? row[i] * inv * w[i] : row[i] * inv;
    }
}

extern "C" __global__ void rms_norm_v4(float* x, const float* w, u32 n_groups, u32 dim, float eps) {
    KERNEL_PROLOGUE();
    rms_norm_impl<true>(x, w, n_groups, dim, eps);
}

extern "C" __global__ void rms_norm_v1(float* x, const float* w, u32 n_groups, u32 dim, float eps) {
    KERNEL_PROLOGUE();
    rms_norm_impl<false>(x, w, n_groups, dim, eps);
}

// --- pointwise --------------------------------------------------------------

// x[i] += y[i]
extern "C" __global__ void add(float* x, const float* y, u64 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE(i, n) x[i] += y[i];
}

// x[i] *= s
extern "C" __global__ void scale(float* x, float s, u64 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE(i, n) x[i] *= s;
}

// gate[i] = gelu_tanh(gate[i]) * up[i]
extern "C" __global__ void gelu_mul(float* gate, const float* up, u64 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE(i, n) gate[i] = gelu_tanh(gate[i]) * up[i];
}

// x[i] = c * tanh(x[i] / c)
extern "C" __global__ void softcap_inplace(float* x, float c, u64 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE(i, n) x[i] = softcap(x[i], c);
}

// dst[dst_off + r*dst_stride + i] (+)= alpha * src[src_off + r*src_stride + i]
// for r < rows, i < len. alpha == 1 copies exactly (no multiply), as the CPU.
extern "C" __global__ void copy_strided(const float* src, u64 src_off, u64 src_stride, float* dst,
                                        u64 dst_off, u64 dst_stride, u64 rows, u64 len,
                                        float alpha, u32 accumulate) {
    KERNEL_PROLOGUE();
    GRID_STRIDE(i, rows * len) {
        const u64 r = i / len, c = i % len;
        const float s = src[src_off + r * src_stride + c];
        float* d = dst + dst_off + r * dst_stride + c;
        if (accumulate) *d += alpha * s;
        else *d = alpha == 1.0f ? s : alpha * s;
    }
}

// --- RoPE (NEOX) ------------------------------------------------------------
// x [n_tok, n_heads, head_dim], row t at positions[t]: for each pair i <
// half, (x[i], x[i + half]) rotated by positions[t] * inv_freq[i]. The
// angle and its sine/cosine are f64 (angles reach 1e5 radians), rounded to
// f32 for the rotation, as on the CPU. Grid (n_tok, head blocks), block
// (pairs, heads): one thread per pair and head.
extern "C" __global__ void rope_neox(float* x, const u32* positions, const double* inv_freq,
                                     u32 n_heads, u32 head_dim, u32 half) {
    KERNEL_PROLOGUE();
    const u32 t = blockIdx.x, h = blockIdx.y * blockDim.y + threadIdx.y;
    if (h >= n_heads) return;
    const double p = (double)positions[t];
    float* v = x + ((u64)t * n_heads + h) * head_dim;
    for (u32 i = threadIdx.x; i < half; i += blockDim.x) {
        double s, c;
        sincos(p * inv_freq[i], &s, &c);
        const float cf = (float)c, sf = (float)s;
        const float a = v[i], b = v[i + half];
        v[i] = a * cf - b * sf;
        v[i + half] = a * sf + b * cf;
    }
}
