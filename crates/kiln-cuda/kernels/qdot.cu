// qdot.cu: the one-token GEMV and greedy head on integer dot products
// (KILN_CUDA_GEMV=qdot, stream.rs), appended after stream.cu, whose
// streaming of weight tiles they share.
//
//   qx_split     x (k values) -> three int8 planes, kiln-kernels' qx.rs
//                scheme: per block b of 32 values d_b = absmax / 127 and
//                x ~ d_b (h + m / S + l / S^2), h, m, l in [-127, 127],
//                S = 254 (representation error <= d_b / (2 S^2), about
//                6e-8 of the block's largest value: as exact as the f32
//                kernels). A non-finite value makes its block's scale NaN,
//                so every dot with it is NaN, never a finite answer.
//   qdot_matvec  stream_matvec, each lane taking a whole scale group (as
//   qdot_argmax  stream_argmax) of its rows: the codes' bytes against the
//                planes by dp4a (unsigned codes, signed planes; per group
//                |sum| <= 32 * 255 * 127, exact in int32), the three sums
//                joined once per group, (S^2 H + S M + L) d_b / S^2, then
//                d * dot + (m - d * BIAS) * sum(x).
//
// Per Q4_K weight (sm_90 SASS, bench/cuda-sass) this issues about a third
// of stream_matvec's instructions: the f32 kernels spend two per weight
// only turning codes into floats.

// Plane scale S (qx.rs).
constexpr float QX_S = 254.0f;

// Where the split x lies: h, m and l (k bytes each), then d_b / S^2 per
// block of 32, then sum(x) per 16 values (stream.rs sizes it; k is a
// multiple of 32).
struct QxPlanes {
    const i8 *h, *m, *l;
    const float *scale, *sum;
    __device__ __forceinline__ QxPlanes(const float* base, int k) {
        const i8* p = (const i8*)base;
        h = p, m = p + k, l = p + 2 * k;
        scale = (const float*)(p + 3 * k);
        sum = scale + k / 32;
    }
};

// One warp per block of 32 values, a lane per value.
KILN_ENTRY(qx_split, WARPS * 32)(const float* x, int k, float* out) {
    KERNEL_PROLOGUE();
    i8* h = (i8*)out;
    float* scale = (float*)(h + 3 * k);
    float* sum = scale + k / 32;
    const int lane = threadIdx.x & 31, warps = gridDim.x * (blockDim.x >> 5);
    for (int b = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); b < k / 32; b += warps) {
        const float v = x[32 * b + lane];
        const bool bad = __any_sync(FULL_MASK, !isfinite(v));
        float amax = fabsf(v);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
        // f64 as qx.rs, so the planes are the CPU's.
        const double d = (double)amax / 127.0;
        int ph = 0, pm = 0, pl = 0;
        if (!bad && d > 0.0) {
            const double t = (double)v / d;
            const double th = rint(t), r = (t - th) * (double)QX_S;
            const double tm = rint(r);
            ph = (int)th, pm = (int)tm, pl = (int)rint((r - tm) * (double)QX_S);
            ph = max(-127, min(127, ph)), pm = max(-127, min(127, pm)), pl = max(-127, min(127, pl));
        }
        h[32 * b + lane] = (i8)ph;
        h[k + 32 * b + lane] = (i8)pm;
        h[2 * k + 32 * b + lane] = (i8)pl;
        // Sums of each half (16 values), a tree over the lanes.
        float s = v;
#pragma unroll
        for (int o = 1; o < 16; o <<= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
        if ((lane & 15) == 0) sum[2 * b + (lane >> 4)] = s;
        if (lane == 0) scale[b] = bad ? __int_as_float(0x7fc00000) : (float)(d / ((double)QX_S * (double)QX_S));
    }
}

// acc += bytes a (unsigned) . bytes b (signed), four products.
__device__ __forceinline__ int dp4a_us(u32 a, u32 b, int acc) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
    return d;
}

// Units a lane takes at once: a scale group (QdotGroup; 16-value groups
// take 2, the rest 4: a legacy block, a Q4_K / Q5_K group).
template <class T>
struct QdotGroup {
    static constexpr int UNITS = 4;
};
template <>
struct QdotGroup<q2_k> {
    static constexpr int UNITS = 2;
};
template <>
struct QdotGroup<q3_k> {
    static constexpr int UNITS = 2;
};
template <>
struct QdotGroup<q6_k> {
    static constexpr int UNITS = 2;
};

// The dots of a warp's rows (one x row, split) for stream_rows.
struct QDots {
    template <class T, int NT, int R>
    static __device__ __forceinline__ void run(const u8* rows, u64 row_bytes, int n, int k, const float* xq, int,
                                               int part, int parts, float (&acc)[R][NT]) {
        static_assert(NT == 1, "one x row");
        constexpr int G = QdotGroup<T>::UNITS;
        const QxPlanes q(xq, k);
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][0] = 0.0f;
        const int n_units = k >> 3;  // whole blocks, so whole groups
        for (int u0 = G * ((threadIdx.x & 31) + 32 * part); u0 < n_units; u0 += 32 * G * parts) {
            const int e0 = 8 * u0;
            // The group's planes: 8 G bytes each (16-byte aligned: e0 is a
            // multiple of 8 G).
            u32 ph[2 * G], pm[2 * G], pl[2 * G];
#pragma unroll
            for (int i = 0; i < G / 2; i++) {
                const uint4 a = ((const uint4*)(q.h + e0))[i], b = ((const uint4*)(q.m + e0))[i],
                            c = ((const uint4*)(q.l + e0))[i];
                ph[4 * i] = a.x, ph[4 * i + 1] = a.y, ph[4 * i + 2] = a.z, ph[4 * i + 3] = a.w;
                pm[4 * i] = b.x, pm[4 * i + 1] = b.y, pm[4 * i + 2] = b.z, pm[4 * i + 3] = b.w;
                pl[4 * i] = c.x, pl[4 * i + 1] = c.y, pl[4 * i + 2] = c.z, pl[4 * i + 3] = c.w;
            }
            const float xd = q.scale[e0 >> 5];
            float xs = q.sum[e0 >> 4];
            if (G == 4) xs += q.sum[(e0 >> 4) + 1];
#pragma unroll
            for (int r = 0; r < R; r++) {
                int j;
                const u8* blk = unit_block<T>(rows + (u64)min(r, n - 1) * row_bytes, u0, j);
                const Affine a = T::affine(blk, j);
                int sh = 0, sm = 0, sl = 0;
#pragma unroll
                for (int i = 0; i < G; i++) {
                    const uint2 c = T::raw(blk, j + i);
                    sh = dp4a_us(c.x, ph[2 * i], sh), sh = dp4a_us(c.y, ph[2 * i + 1], sh);
                    sm = dp4a_us(c.x, pm[2 * i], sm), sm = dp4a_us(c.y, pm[2 * i + 1], sm);
                    sl = dp4a_us(c.x, pl[2 * i], sl), sl = dp4a_us(c.y, pl[2 * i + 1], sl);
                }
                const float dot = fmaf(fmaf((float)sh, QX_S, (float)sm), QX_S, (float)sl);
                float v = fmaf(a.d * xd, dot, acc[r][0]);
                // sum((code - BIAS) x) d + m sum(x).
                if (T::HAS_MIN || T::BIAS != 0.0f) v = fmaf(a.m - a.d * T::BIAS, xs, v);
                if (r < n) acc[r][0] = v;
            }
        }
#pragma unroll
        for (int r = 0; r < R; r++) acc[r][0] = warp_sum(acc[r][0]);
    }
};

// ---- entry points -------------------------------------------------------------

// As KILN_STREAM, x being qx_split's output. Quantized types only (the
// plain ones have no codes; their bodies compile to nothing and the host
// never sends them).
template <class T, int R>
__device__ __forceinline__ void qdot_matvec(const u8* w, u64 row_bytes, const u8* end, int row0, int n_rows, int k,
                                            int tile_rows, u32 stage_bytes, int max_parts, const float* xq,
                                            float* out) {
    if constexpr (T::QK >= 32)
        stream_matvec<T, R, QDots>(w, row_bytes, end, row0, n_rows, k, tile_rows, stage_bytes, max_parts, xq, out);
}

template <class T, int R>
__device__ __forceinline__ void qdot_argmax(const u8* w, u64 row_bytes, const u8* end, int n_rows, int k,
                                            int tile_rows, u32 stage_bytes, int max_parts, const float* xq,
                                            int n_tok, u64* cell, u32* ids, int slot) {
    if constexpr (T::QK >= 32)
        stream_argmax<T, 1, R, QDots>(w, row_bytes, end, n_rows, k, tile_rows, stage_bytes, max_parts, xq, n_tok,
                                      cell, ids, slot);
}

#define KILN_QDOT(R)                                                                                             \
    extern "C" __global__ void __launch_bounds__(STREAM_WARPS * 32)                                               \
        KILN_CAT(KILN_CAT(qdot_matvec, KILN_WEIGHT), r##R)(const u8* w, u64 row_bytes, const u8* end, int row0,   \
                                                          int n_rows, int k, int tile_rows, u32 stage_bytes,       \
                                                          int max_parts, const float* xq, float* out) {           \
        qdot_matvec<KILN_WEIGHT, R>(w, row_bytes, end, row0, n_rows, k, tile_rows, stage_bytes, max_parts, xq,    \
                                    out);                                                                         \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(STREAM_WARPS * 32)                                               \
        KILN_CAT(KILN_CAT(qdot_argmax, KILN_WEIGHT), r##R)(const u8* w, u64 row_bytes, const u8* end, int n_rows, \
                                                          int k, int tile_rows, u32 stage_bytes, int max_parts,    \
                                                          const float* xq, int n_tok, u64* cell, u32* ids,        \
                                                          int slot) {                                             \
        qdot_argmax<KILN_WEIGHT, R>(w, row_bytes, end, n_rows, k, tile_rows, stage_bytes, max_parts, xq, n_tok,   \
                                    cell, ids, slot);                                                             \
    }

KILN_QDOT(1)
KILN_QDOT(2)
KILN_QDOT(4)
