// Fused ops of a decode layer: Gemma's sandwich norms around a residual
// add, the split of a fused q/k/v projection with per-head norms and RoPE,
// and the GELU gate of a fused gate/up projection. Each does in one kernel
// what the Backend trait's default (crates/kiln-model/src/backend.rs) does
// with several elementwise.cu kernels, in the same arithmetic order: f64
// sums of squares, `x * inv * w` products, f64 RoPE angles.

// V consecutive floats, loaded as one float4 when V == 4.
template <int V>
struct Pack {
    float v[V];
};

template <int V>
__device__ __forceinline__ Pack<V> load_pack(const float* p) {
    Pack<V> r;
    if constexpr (V == 4) {
        const float4 q = *reinterpret_cast<const float4*>(p);
        r.v[0] = q.x; r.v[1] = q.y; r.v[2] = q.z; r.v[3] = q.w;
    } else {
        r.v[0] = *p;
    }
    return r;
}

template <int V>
__device__ __forceinline__ void store_pack(float* p, const Pack<V>& r) {
    if constexpr (V == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(r.v[0], r.v[1], r.v[2], r.v[3]);
    } else {
        *p = r.v[0];
    }
}

// 1 / sqrt(mean + eps) of a sum of squares over d values, as rms_norm.
__device__ __forceinline__ float inv_rms(double ss, u32 d, float eps) {
    return (float)(1.0 / sqrt(ss / (double)d + (double)eps));
}

// --- add + RMS norms ------------------------------------------------------
// Block t (one per row, d values): y = y * inv_rms(y) * post; x += y; then
// with `pre` y = x * inv_rms(x) * pre, else y keeps the normed value. `x`
// points at the row block's first row. Each thread re-reads only what it
// wrote itself.
template <int V>
__device__ void add_rms_norm_impl(float* y, const float* post, float* x, const float* pre, u32 d,
                                  float eps) {
    __shared__ double scratch[32];
    float* yr = y + (u64)blockIdx.x * d;
    float* xr = x + (u64)blockIdx.x * d;
    const u32 step = V * blockDim.x;
    double ss = 0.0;
    for (u32 i = V * threadIdx.x; i < d; i += step) {
        const Pack<V> a = load_pack<V>(yr + i);
#pragma unroll
        for (int j = 0; j < V; ++j) ss += (double)a.v[j] * a.v[j];
    }
    const float inv_y = inv_rms(block_sum(ss, scratch), d, eps);
    double sx = 0.0;
    for (u32 i = V * threadIdx.x; i < d; i += step) {
        Pack<V> a = load_pack<V>(yr + i), r = load_pack<V>(xr + i);
        const Pack<V> w = load_pack<V>(post + i);
#pragma unroll
        for (int j = 0; j < V; ++j) {
            a.v[j] = a.v[j] * inv_y * w.v[j];
            r.v[j] += a.v[j];
            sx += (double)r.v[j] * r.v[j];
        }
        store_pack<V>(xr + i, r);
        if (!pre) store_pack<V>(yr + i, a);
    }
    if (!pre) return;
    const float inv_x = inv_rms(block_sum(sx, scratch), d, eps);
    for (u32 i = V * threadIdx.x; i < d; i += step) {
        Pack<V> r = load_pack<V>(xr + i);
        const Pack<V> w = load_pack<V>(pre + i);
#pragma unroll
        for (int j = 0; j < V; ++j) r.v[j] = r.v[j] * inv_x * w.v[j];
        store_pack<V>(yr + i, r);
    }
}

extern "C" __global__ void add_rms_norm_v4(float* y, const float* post, float* x, const float* pre,
                                           u32 d, float eps) {
    KERNEL_PROLOGUE();
    add_rms_norm_impl<4>(y, post, x, pre, d, eps);
}

extern "C" __global__ void add_rms_norm_v1(float* y, const float* post, float* x, const float* pre,
                                           u32 d, float eps) {
    KERNEL_PROLOGUE();
    add_rms_norm_impl<1>(y, post, x, pre, d, eps);
}

// --- split of a fused q/k/v projection --------------------------------------
// The argument block (`HeadsArgs` in src/fused.rs: same fields, same order).
#define MAX_PARTS 3
#define MAX_HEAD_DIM 512
struct HeadsArgs {
    const float* src;        // [n_tok, width]: each part's heads in turn
    const u32* positions;    // the step's, one per row
    const double* inv_freq;  // RoPE inverse frequencies, `half` of them
    float* dst[MAX_PARTS];   // [n_tok, heads[p] * head_dim]
    const float* norm[MAX_PARTS]; // per-head RMS weights, or null
    u32 heads[MAX_PARTS];
    u32 rope[MAX_PARTS];
    u32 n_parts, width, head_dim, half;
    float eps;
    u32 pad;
};

// Block (row t, head): the head goes through shared memory: normed (when
// its part has a weight), rotated (pairs i, i + half, when its part is
// roped), written to its part's row. The rotation's sines and cosines
// (f64, the CPU's) depend only on the row's position, which the host
// staged before the step's first kernel ran, so they are computed before
// waiting for the projection that writes `src`.
extern "C" __global__ void split_heads(HeadsArgs a) {
    __shared__ float v[MAX_HEAD_DIM];
    __shared__ float rot_cos[MAX_HEAD_DIM / 2], rot_sin[MAX_HEAD_DIM / 2];
    __shared__ double scratch[32];
    const u32 t = blockIdx.x, hd = a.head_dim;
    u32 h = blockIdx.y, p = 0, off = 0;
    while (p + 1 < a.n_parts && h >= a.heads[p]) {
        off += a.heads[p] * hd;
        h -= a.heads[p];
        ++p;
    }
    if (a.rope[p]) {
        const double pos = (double)a.positions[t];
        // Each thread later reads back only the pairs it wrote here.
        for (u32 i = threadIdx.x; i < a.half; i += blockDim.x) {
            double sn, cs;
            sincos(pos * a.inv_freq[i], &sn, &cs);
            rot_cos[i] = (float)cs;
            rot_sin[i] = (float)sn;
        }
    }
    KERNEL_PROLOGUE();
    const float* s = a.src + (u64)t * a.width + off + (u64)h * hd;
    const float* w = a.norm[p];
    double ss = 0.0;
    for (u32 i = threadIdx.x; i < hd; i += blockDim.x) {
        const float x = s[i];
        v[i] = x;
        ss += (double)x * x;
    }
    if (w) {
        const float inv = inv_rms(block_sum(ss, scratch), hd, a.eps);
        for (u32 i = threadIdx.x; i < hd; i += blockDim.x) v[i] = v[i] * inv * w[i];
    }
    __syncthreads();
    if (a.rope[p]) {
        for (u32 i = threadIdx.x; i < a.half; i += blockDim.x) {
            const float cf = rot_cos[i], sf = rot_sin[i];
            const float x0 = v[i], x1 = v[i + a.half];
            v[i] = x0 * cf - x1 * sf;
            v[i + a.half] = x0 * sf + x1 * cf;
        }
        __syncthreads();
    }
    float* out = a.dst[p] + ((u64)t * a.heads[p] + h) * hd;
    for (u32 i = threadIdx.x; i < hd; i += blockDim.x) out[i] = v[i];
}

// --- GELU gate of a fused gate/up projection ---------------------------------
// out[t, i] = gelu_tanh(gu[t, i]) * gu[t, ff + i] for the n = n_tok * ff
// outputs.
extern "C" __global__ void gelu_mul_halves(const float* gu, float* out, u32 ff, u64 n) {
    KERNEL_PROLOGUE();
    GRID_STRIDE(i, n) {
        const u64 t = i / ff, c = i % ff;
        const float* row = gu + t * 2 * ff;
        out[i] = gelu_tanh(row[c]) * row[ff + c];
    }
}
