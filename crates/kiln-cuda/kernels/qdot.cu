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

// acc += bytes a (unsigned, or signed where SIGNED) . bytes b (signed),
// four products.
template <bool SIGNED>
__device__ __forceinline__ int dp4a(u32 a, u32 b, int acc) {
    int d;
    if constexpr (SIGNED)
        asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
    else
        asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(acc));
    return d;
}

// Units a lane takes at once: a scale group (16-value groups take 2, the
// rest 4: a legacy block, a Q4_K / Q5_K group).
template <class T>
struct QdotUnits {
    static constexpr int N = 4;
};
template <>
struct QdotUnits<q2_k> {
    static constexpr int N = 2;
};
template <>
struct QdotUnits<q3_k> {
    static constexpr int N = 2;
};
template <>
struct QdotUnits<q6_k> {
    static constexpr int N = 2;
};

// The codes (bytes, four to a word; signed where SIGNED) and affine of the
// group at unit u0 of the row at `row`, through quant.cuh's raw / affine:
// dot d * sum(c x) + (m - d BIAS) * sum(x).
template <class T>
struct QdotGroup {
    static constexpr int UNITS = QdotUnits<T>::N;
    static constexpr bool SIGNED = false;
    static constexpr float BIAS = T::BIAS;
    static __device__ __forceinline__ void load(const u8* row, int u0, u32 (&c)[2 * UNITS], Affine& a) {
        int j;
        const u8* blk = unit_block<T>(row, u0, j);
        a = T::affine(blk, j);
#pragma unroll
        for (int i = 0; i < UNITS; i++) {
            const uint2 r = T::raw(blk, j + i);
            c[2 * i] = r.x, c[2 * i + 1] = r.y;
        }
    }
};

// Loads from a 2-aligned block `b`: aligned words joined by funnel shifts
// (rather than two-byte loads). N words from byte `at` (a multiple of 4)
// of the block read N aligned words, and where b is not 4-aligned the two
// bytes after them (never a byte past the N words' own).
struct BlockWords {
    const u32* w;
    u32 shift;
    __device__ __forceinline__ BlockWords(const u8* b)
        : w((const u32*)((size_t)b & ~(size_t)3)), shift(((u32)(size_t)b & 2) * 8) {}
    template <int N>
    __device__ __forceinline__ void load(int at, u32 (&out)[N]) const {
        u32 v[N + 1];
#pragma unroll
        for (int i = 0; i < N; i++) v[i] = __ldg(w + at / 4 + i);
        v[N] = shift ? (u32)__ldg((const unsigned short*)(w + at / 4 + N)) : 0u;
#pragma unroll
        for (int i = 0; i < N; i++) out[i] = __funnelshift_r(v[i], v[i + 1], shift);
    }
};

// Q8_0 (2-aligned blocks): the 32 signed codes as 8 words.
template <>
struct QdotGroup<q8_0> {
    static constexpr int UNITS = 4;
    static constexpr bool SIGNED = true;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ void load(const u8* row, int u0, u32 (&c)[8], Affine& a) {
        const u8* b = row + (size_t)(u0 >> 2) * q8_0::BYTES;
        BlockWords(b + 2).load(0, c);
        a = q8_0::affine(b, 0);
    }
};

// Q6_K (2-aligned blocks): group g's 16 low nibbles and 16 two-bit highs
// (q6_k::raw's layout) in two runs of 4 words; each high pair rotated to
// bits 4-5 of its byte.
template <>
struct QdotGroup<q6_k> {
    static constexpr int UNITS = 2;
    static constexpr bool SIGNED = false;
    static constexpr float BIAS = q6_k::BIAS;
    static __device__ __forceinline__ void load(const u8* row, int u0, u32 (&c)[4], Affine& a) {
        const u8* b = row + (size_t)(u0 >> 5) * q6_k::BYTES;
        const int g = (u0 >> 1) & 15;
        const int h = g >> 3, k = (g & 7) >> 1, l0 = 16 * (g & 1);
        u32 ql[4], qh[4];
        const BlockWords bw(b);
        bw.load(64 * h + 32 * (k & 1) + l0, ql);
        bw.load(128 + 32 * h + l0, qh);
        const int lo = 4 * (k >> 1), hi = (4 - 2 * k) & 31;
#pragma unroll
        for (int i = 0; i < 4; i++) c[i] = ((ql[i] >> lo) & 0x0F0F0F0Fu) | (__funnelshift_l(qh[i], qh[i], hi) & 0x30303030u);
        a = q6_k::affine(b, 2 * g);
    }
};

// Q4_K in three 16-byte loads: the block's head (d, dmin, scales) and the
// 32 qs bytes whose low (even g) or high (odd g) nibbles are group g. The
// high nibbles stay in place, so the codes are 16 q and the scale carries
// 1/16: a power of two, so every product and sum is the unshifted one
// times 16 exactly and the dot is the same float (k4_affine's scales,
// unpacked from registers).
template <>
struct QdotGroup<q4_k> {
    static constexpr int UNITS = 4;
    static constexpr bool SIGNED = false;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ void load(const u8* row, int u0, u32 (&c)[8], Affine& a) {
        const u8* b = row + (size_t)(u0 >> 5) * q4_k::BYTES;
        const int g = (u0 >> 2) & 7;
        const uint4 h = *(const uint4*)b;
        const uint4* qs = (const uint4*)(b + 16 + 32 * (g >> 1));
        const uint4 q0 = qs[0], q1 = qs[1];
        const u32 mask = (g & 1) ? 0xF0F0F0F0u : 0x0F0F0F0Fu;
        c[0] = q0.x & mask, c[1] = q0.y & mask, c[2] = q0.z & mask, c[3] = q0.w & mask;
        c[4] = q1.x & mask, c[5] = q1.y & mask, c[6] = q1.z & mask, c[7] = q1.w & mask;
        // scales[0..12] are bytes 4..16: h.y, h.z, h.w.
        const int sh = 8 * (g & 3);
        const u32 s0 = (h.y >> sh) & 0xFF, s4 = (h.z >> sh) & 0xFF, s8 = (h.w >> sh) & 0xFF;
        const u32 sc = g < 4 ? s0 & 63 : (s8 & 0xF) | ((s0 >> 6) << 4);
        const u32 mn = g < 4 ? s4 & 63 : (s8 >> 4) | ((s4 >> 6) << 4);
        a.d = f16_to_f32(h.x & 0xFFFF) * (float)sc * ((g & 1) ? 0.0625f : 1.0f);
        a.m = -(f16_to_f32(h.x >> 16) * (float)mn);
    }
};

// The dots of a warp's rows (one x row, split) for stream_rows, read
// straight from global memory (on an H100 the 4B's tg128 311 -> 339-345
// tok/s against staged rows).
struct QDots {
    static constexpr bool STAGED = false;
    template <class T, int NT, int R>
    static __device__ __forceinline__ void run(const u8* rows, u64 row_bytes, int n, int k, const float* xq, int,
                                               int part, int parts, float (&acc)[R][NT]) {
        static_assert(NT == 1, "one x row");
        constexpr int G = QdotGroup<T>::UNITS;
        const QxPlanes q(xq, k);
        const u8* row[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            acc[r][0] = 0.0f;
            row[r] = rows + (u64)min(r, n - 1) * row_bytes;
        }
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
                u32 c[2 * G];
                Affine a;
                QdotGroup<T>::load(row[r], u0, c, a);
                int sh = 0, sm = 0, sl = 0;
#pragma unroll
                for (int i = 0; i < 2 * G; i++) {
                    sh = dp4a<QdotGroup<T>::SIGNED>(c[i], ph[i], sh);
                    sm = dp4a<QdotGroup<T>::SIGNED>(c[i], pm[i], sm);
                    sl = dp4a<QdotGroup<T>::SIGNED>(c[i], pl[i], sl);
                }
                const float dot = fmaf(fmaf((float)sh, QX_S, (float)sm), QX_S, (float)sl);
                float v = fmaf(a.d * xd, dot, acc[r][0]);
                // sum((code - BIAS) x) d + m sum(x).
                constexpr float BIAS = QdotGroup<T>::BIAS;
                if (T::HAS_MIN || BIAS != 0.0f) v = fmaf(a.m - a.d * BIAS, xs, v);
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
