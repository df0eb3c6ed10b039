// mma.cu: the tensor-core GEMM of prefill and batched decode (mma.rs says
// which products take it), appended to matmul.cu (same weight type, same
// helpers).
//
//   mma_gemm      out[t, r] = dot(W[row0 + r], x[t]) for any number of
//                 token rows: a CTA stages a weight tile (rows x 64
//                 columns) in shared memory as its integer codes, with
//                 each 16-column chunk's scale and min beside them, and
//                 the tokens' x tile as three bfloat16 planes, and
//                 multiplies them on the tensor cores (mma.sync m16n8k16,
//                 bf16 operands, f32 accumulators). Split along k like
//                 skinny.cu's gemm (the partial sums go through
//                 gemm_split_sum).
//
// Exactness: every unit decodes to w = d q + m with small integer codes q
// (quant.cuh) under one (d, m) per 16 columns, so a chunk's dot is
// d * sum(q x) + m * sum(x). The codes (at most 8 significant bits) are
// exact in bfloat16; x is split into three bfloat16 planes hi + mid + lo
// (each the rounding of what the ones before left: 24 bits, the whole f32
// mantissa but for the last rounding), so each q * plane product is exact
// and sum(q x) over a chunk is an f32 accumulation of exact products. The
// result is that of the exact weights (not kiln-quant's f32-rounded
// d * q + m, which differs by ~2^-24 relative) at f32 accumulation
// accuracy: tests/matmul.rs holds it to 1e-5 of sum |w x|, as the f32
// kernels. BF16 weights are their own codes (d = 1). F32 and F16 weights
// are not exact in bfloat16: the host never sends them here (their bodies
// compile to nothing), nor anything below sm_80.
// A non-finite x gives NaN (inf - inf in the split), never a finite value.

// Elements of a k step (eight 8-value units, four 16-column chunks).
// Shared memory holds bfloat16 pairs as 32-bit words; a row of a tile is
// MMA_STRIDE words, which puts the 8 x 4 words of a fragment load (rows
// g, columns t) on distinct banks and keeps rows 16-byte aligned.
constexpr int MMA_K = 64;
constexpr int MMA_K_UNITS = MMA_K / 8;
constexpr int MMA_CHUNKS = MMA_K / 16;
constexpr int MMA_STRIDE = MMA_K / 2 + 4;
constexpr int MMA_PLANES = 3;

// Whether a weight type's codes are exact in bfloat16: every quantized
// type (codes of at most 8 bits) and BF16 itself.
template <class T>
struct CodesFitBf16 {
    static constexpr bool value = T::QK >= 32;
};
template <>
struct CodesFitBf16<bf16> {
    static constexpr bool value = true;
};

// Columns under one (d, m) in a type's rows: 32 for the legacy blocks and
// Q4_K / Q5_K, 16 for Q2_K / Q3_K / Q6_K (and BF16, d = 1). mma2.cu sums
// the products of a group's chunks into one f32 tile before applying d
// and m.
template <class T>
struct MmaGroup {
    static constexpr int COLS = 16;
};
#define KILN_MMA_GROUP32(T)             \
    template <>                         \
    struct MmaGroup<T> {                \
        static constexpr int COLS = 32; \
    };
KILN_MMA_GROUP32(q4_0)
KILN_MMA_GROUP32(q4_1)
KILN_MMA_GROUP32(q5_0)
KILN_MMA_GROUP32(q5_1)
KILN_MMA_GROUP32(q8_0)
KILN_MMA_GROUP32(q4_k)
KILN_MMA_GROUP32(q5_k)

// {bf16(lo), bf16(hi)} in one word (lo in the low half: the lower column
// of an MMA fragment pair), each rounded to nearest.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r = 0;
#if __CUDA_ARCH__ >= 800
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}
__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xFFFF0000u); }

// c += a b for one 16 x 8 x 16 bf16 tile (PTX fragment layouts: lane
// (g, t) = (lane / 4, lane % 4) holds A rows g and g + 8 at column pairs
// 2t and 2t + 8, B column g at row pairs 2t and 2t + 8, C rows g and g + 8
// at columns 2t, 2t + 1).
// (TYPE: the operands' PTX type, bf16 or f16; mma2.cu's half planes take
// the f16 form.)
#define KILN_MMA_16816(TYPE)                                                                                    \
    asm("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "    \
        "{%8, %9}, {%0, %1, %2, %3};"                                                                          \
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                        \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
__device__ __forceinline__ void mma_bf16(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    KILN_MMA_16816("bf16");
#endif
}

// A CTA of WM x WN warps; warp (wm, wn) computes weight rows 32 wm .. +32
// against tokens 8 N8 wn .. +8 N8 (2 x N8 MMA tiles). The CTA covers ROWS
// weight rows and TOKENS tokens.
template <int WM, int WN, int N8>
struct MmaShape {
    static constexpr int ROWS = 32 * WM, TOKENS = 8 * N8 * WN, THREADS = 32 * WM * WN;
    // Units of the weight tile and float4s of the x tile per thread.
    static constexpr int W_PASSES = ROWS * MMA_K_UNITS / THREADS;
    static constexpr int X_PASSES = TOKENS * MMA_K / 4 / THREADS;
    static_assert(ROWS * MMA_K_UNITS % THREADS == 0 && TOKENS * MMA_K / 4 % THREADS == 0, "whole passes");
    // Shared memory in words: codes, then (d, m) per row and chunk, then
    // the x planes, then sum(x) per token and chunk (mma.rs mirrors it).
    static constexpr int W_WORDS = ROWS * MMA_STRIDE, A_WORDS = ROWS * MMA_CHUNKS * 2;
    static constexpr int X_WORDS = MMA_PLANES * TOKENS * MMA_STRIDE, S_WORDS = TOKENS * MMA_CHUNKS;
};

// The next k step, held in registers while the current one is multiplied:
// W_PASSES units as codes and affines, X_PASSES float4s of x.
template <class S>
struct MmaStage {
    float q[S::W_PASSES][8];
    Affine a[S::W_PASSES];
    float4 x[S::X_PASSES];
};

// Loads the k step from unit u0 (units at or past u_end, rows at or past
// n_rows and tokens at or past n_tok as zeros) into `st`. Branch-free (an
// absent element reads a present one's address, then selects 0), so the
// compiler may issue the loads before the previous step's MMAs.
template <class T, class S>
__device__ __forceinline__ void mma_load(const u8* __restrict__ w, u64 row_bytes, int n_rows, int k, int u0,
                                         int u_end, const float* __restrict__ x, int n_tok, MmaStage<S>& st) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int p = 0; p < S::X_PASSES; p++) {
        const int i = threadIdx.x + p * S::THREADS;
        const int t = i / (MMA_K / 4), c = 8 * u0 + 4 * (i % (MMA_K / 4));
        const bool ok = t < n_tok && c < 8 * u_end;
        const float4 v = *(const float4*)(x + (size_t)min(t, n_tok - 1) * k + min(c, 8 * u_end - 4));
        st.x[p] = ok ? v : zero;
    }
    // Eight consecutive threads read one row's eight units.
#pragma unroll
    for (int p = 0; p < S::W_PASSES; p++) {
        const int i = threadIdx.x + p * S::THREADS;
        const int r = i / MMA_K_UNITS, u = u0 + i % MMA_K_UNITS;
        const bool ok = r < n_rows && u < u_end;
        Unit un;
        load_unit<T>(w + (u64)min(r, n_rows - 1) * row_bytes, min(u, u_end - 1), un);
#pragma unroll
        for (int e = 0; e < 8; e++) st.q[p][e] = ok ? un.q[e] : 0.0f;
        st.a[p] = un.a;
    }
}

// Stores this thread's unit of pass p into shared memory: its codes as
// 16-bit pairs, and, from a group's first unit, the (d, m) of its group of
// G columns (mma2.cu's weight store shares it).
template <class S, int G>
__device__ __forceinline__ void mma_store_unit(int p, uint4 codes, Affine a, u32* ws, float2* wa) {
    constexpr int GU = G / 8;  // 2 or 4 units
    static_assert(GU == 2 || GU == 4, "groups of 16 or 32 columns");
    const int i = threadIdx.x + p * S::THREADS;
    const int r = i / MMA_K_UNITS, j = i % MMA_K_UNITS;
    *(uint4*)(ws + r * MMA_STRIDE + 4 * j) = codes;
    if ((j & (GU - 1)) == 0) wa[r * (MMA_K / G) + (j >> (GU == 4 ? 2 : 1))] = make_float2(a.d, a.m);
}

// Writes the staged step's weights into shared memory: codes as bfloat16
// (exact), and the (d, m) of each group of G columns (from its first unit).
template <class S, int G>
__device__ __forceinline__ void mma_store_w(const MmaStage<S>& st, u32* ws, float2* wa) {
#pragma unroll
    for (int p = 0; p < S::W_PASSES; p++) {
        const float* q = st.q[p];
        mma_store_unit<S, G>(p, make_uint4(pack_bf16(q[0], q[1]), pack_bf16(q[2], q[3]), pack_bf16(q[4], q[5]),
                                           pack_bf16(q[6], q[7])),
                             st.a[p], ws, wa);
    }
}

// Writes the staged step into shared memory: codes as bfloat16 (exact),
// each chunk's affine (from its first unit: units 2p and 2p + 1 share it),
// x as three planes and, for types with a min, each chunk's sum(x).
template <class T, class S>
__device__ __forceinline__ void mma_store(const MmaStage<S>& st, u32* ws, float2* wa, u32* xs, float* xsum) {
#pragma unroll
    for (int p = 0; p < S::X_PASSES; p++) {
        const int i = threadIdx.x + p * S::THREADS;
        const int t = i / (MMA_K / 4), c4 = i % (MMA_K / 4);
        const float v[4] = {st.x[p].x, st.x[p].y, st.x[p].z, st.x[p].w};
        float rest[4] = {v[0], v[1], v[2], v[3]};
#pragma unroll
        for (int plane = 0; plane < MMA_PLANES; plane++) {
            const u32 w01 = pack_bf16(rest[0], rest[1]), w23 = pack_bf16(rest[2], rest[3]);
            rest[0] -= bf16_lo(w01), rest[1] -= bf16_hi(w01), rest[2] -= bf16_lo(w23), rest[3] -= bf16_hi(w23);
            *(uint2*)(xs + (plane * S::TOKENS + t) * MMA_STRIDE + 2 * c4) = make_uint2(w01, w23);
        }
        if (T::HAS_MIN) {
            // The four threads of a chunk are adjacent lanes (16 | 32).
            float s = (v[0] + v[1]) + (v[2] + v[3]);
            s += __shfl_xor_sync(FULL_MASK, s, 1);
            s += __shfl_xor_sync(FULL_MASK, s, 2);
            if ((c4 & 3) == 0) xsum[t * MMA_CHUNKS + (c4 >> 2)] = s;
        }
    }
    mma_store_w<S, 16>(st, ws, wa);
}

// acc[.][ni] += d * part (+ m * sum(x)) for one 8-token tile: aff holds
// the (d, m) of rows g and g + 8 of both 16-row tiles, `sum` the x sum of
// token 2t of this group (token 2t + 1's `stride` floats on).
template <class T, int N8>
__device__ __forceinline__ void mma_apply(float (&acc)[2][N8][4], int ni, const float (&part)[2][4],
                                          const float2 (&aff)[2][2], const float* sum, int stride) {
    float s[2] = {0.0f, 0.0f};
    if (T::HAS_MIN) s[0] = sum[0], s[1] = sum[stride];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const float2 af = aff[mi][c >> 1];
            float v = fmaf(af.x, part[mi][c], acc[mi][ni][c]);
            if (T::HAS_MIN) v = fmaf(af.y, s[c & 1], v);
            acc[mi][ni][c] = v;
        }
}

// Stores warp (wm, wn)'s outputs: row r < rows of the tile at `tile`,
// token tt < nt of the tile at tok0, at dst[(tok0 + tt) * n_rows + tile + r].
template <int N8>
__device__ __forceinline__ void mma_write(const float (&acc)[2][N8][4], float* __restrict__ dst, int n_rows, int tile,
                                          int rows, int tok0, int nt, int wm, int wn) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < N8; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int r = 32 * wm + 16 * mi + g + 8 * (c >> 1);
                const int tt = 8 * N8 * wn + 8 * ni + 2 * t + (c & 1);
                if (r < rows && tt < nt) dst[(size_t)(tok0 + tt) * n_rows + tile + r] = acc[mi][ni][c];
            }
}

// acc += this warp's block of the step in shared memory: per chunk, the
// three planes' products into a fresh f32 tile (small planes first), then
// acc += d * tile (+ m * sum(x)).
template <class T, int N8>
__device__ __forceinline__ void mma_step(const u32* ws, const float2* wa, const u32* xs, int plane_words,
                                         const float* xsum, float (&acc)[2][N8][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int ch = 0; ch < MMA_CHUNKS; ch++) {
        const int kw = 8 * ch + t;
        u32 a[2][4];
        float2 aff[2][2];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const u32* p = ws + (16 * mi + g) * MMA_STRIDE + kw;
            a[mi][0] = p[0], a[mi][1] = p[8 * MMA_STRIDE], a[mi][2] = p[4], a[mi][3] = p[8 * MMA_STRIDE + 4];
            aff[mi][0] = wa[(16 * mi + g) * MMA_CHUNKS + ch];
            aff[mi][1] = wa[(16 * mi + g + 8) * MMA_CHUNKS + ch];
        }
#pragma unroll
        for (int ni = 0; ni < N8; ni++) {
            float part[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int plane = MMA_PLANES - 1; plane >= 0; plane--) {
                const u32* p = xs + plane * plane_words + (8 * ni + g) * MMA_STRIDE + kw;
                const u32 b[2] = {p[0], p[4]};
                mma_bf16(part[0], a[0], b);
                mma_bf16(part[1], a[1], b);
            }
            mma_apply<T, N8>(acc, ni, part, aff, xsum + (8 * ni + 2 * t) * MMA_CHUNKS + ch, MMA_CHUNKS);
        }
    }
}

// acc += this warp's block of W tile `wt` (`rows` rows left from it)
// times x tile `xt` (nt tokens) over units u_begin .. u_end, a k step at a
// time through the CTA's shared memory (the caller's acc starts at 0).
template <class T, class S, int N8>
__device__ __forceinline__ void mma_tile(const u8* __restrict__ wt, u64 row_bytes, int rows, int k,
                                         const float* __restrict__ xt, int nt, int u_begin, int u_end,
                                         u32* smem, float (&acc)[2][N8][4]) {
    u32* ws = smem;
    float2* wa = (float2*)(ws + S::W_WORDS);
    u32* xs = ws + S::W_WORDS + S::A_WORDS;
    float* xsum = (float*)(xs + S::X_WORDS);
    const int warp = threadIdx.x >> 5, wm = warp % (S::ROWS / 32), wn = warp / (S::ROWS / 32);
    MmaStage<S> st;
    mma_load<T, S>(wt, row_bytes, rows, k, u_begin, u_end, xt, nt, st);
    for (int u0 = u_begin; u0 < u_end; u0 += MMA_K_UNITS) {
        __syncthreads();  // the previous step has read the tiles
        mma_store<T, S>(st, ws, wa, xs, xsum);
        __syncthreads();
        // The next step's loads are in flight while this one multiplies.
        // (Past the end it reloads the last units: in bounds, never
        // stored.)
        mma_load<T, S>(wt, row_bytes, rows, k, min(u0 + MMA_K_UNITS, u_end - 1), u_end, xt, nt, st);
        mma_step<T, N8>(ws + 32 * wm * MMA_STRIDE, wa + 32 * wm * MMA_CHUNKS, xs + 8 * N8 * wn * MMA_STRIDE,
                        S::TOKENS * MMA_STRIDE, xsum + 8 * N8 * wn * MMA_CHUNKS, acc);
    }
}

template <int N8>
__device__ __forceinline__ void zero_acc(float (&acc)[2][N8][4]) {
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < N8; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][ni][c] = 0.0f;
}

// CTA (x, y, z) computes weight rows S::ROWS x .. + S::ROWS (of the n_rows
// from row0) against tokens S::TOKENS z .. + S::TOKENS, over units
// y * units_per_split .. (y + 1) * units_per_split (a multiple of
// MMA_K_UNITS). With one split it writes out[t * n_rows + r]; with more,
// the split's partial sums at out[(y * n_tok + t) * n_rows + r].
template <class T, int WM, int WN, int N8>
__device__ __forceinline__ void mma_gemm(const u8* __restrict__ w, u64 row_bytes, int row0, int n_rows, int k,
                                         const float* __restrict__ x, int n_tok, int units_per_split,
                                         float* __restrict__ out) {
#if __CUDA_ARCH__ >= 800
    if constexpr (CodesFitBf16<T>::value) {
        using S = MmaShape<WM, WN, N8>;
        // Laid out as MmaShape says (mma.rs sizes the launch; above 48 KiB
        // it opts in).
        extern __shared__ __align__(16) u32 mma_smem[];
        const int tile = blockIdx.x * S::ROWS, tok0 = blockIdx.z * S::TOKENS;
        const int u_begin = blockIdx.y * units_per_split, u_end = min(k >> 3, u_begin + units_per_split);
        const int rows = n_rows - tile, nt = min(S::TOKENS, n_tok - tok0);
        KERNEL_PROLOGUE();
        float acc[2][N8][4];
        zero_acc(acc);
        mma_tile<T, S, N8>(w + (u64)(row0 + tile) * row_bytes, row_bytes, rows, k, x + (size_t)tok0 * k, nt, u_begin,
                           u_end, mma_smem, acc);
        const int warp = threadIdx.x >> 5;
        mma_write(acc, out + (size_t)blockIdx.y * n_tok * n_rows, n_rows, tile, rows, tok0, nt, warp % WM, warp / WM);
    }
#endif
}

// Folds warp (wm, wn)'s dots of the row tile at `tile` into best[token]:
// per token column the best of this lane's four rows, then of the eight
// lanes (g) that share the column, then of the WM warps (shared-memory
// atomics: order-free).
template <int N8>
__device__ __forceinline__ void mma_fold_best(const float (&acc)[2][N8][4], int tile, int n_rows, int nt, int wm,
                                              int wn, u64* best) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int ni = 0; ni < N8; ni++)
#pragma unroll
        for (int odd = 0; odd < 2; odd++) {
            u64 b = 0;
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int hi = 0; hi < 2; hi++) {
                    const int r = tile + 32 * wm + 16 * mi + g + 8 * hi;
                    if (r < n_rows) b = max_u64(b, argmax_key(acc[mi][ni][2 * hi + odd], (u32)r));
                }
#pragma unroll
            for (int o = 4; o < 32; o <<= 1) b = max_u64(b, __shfl_xor_sync(FULL_MASK, b, o));
            const int tt = 8 * N8 * wn + 8 * ni + 2 * t + odd;
            if (g == 0 && tt < nt) atomicMax((unsigned long long*)&best[tt], (unsigned long long)b);
        }
}

// The greedy head of a batch: CTA (x, 0, z) takes row tiles x, x +
// gridDim.x, ... of all n_rows rows (whole rows: no split along k)
// against tokens S::TOKENS z .., and writes each token's largest
// argmax_key over its rows to partials[(tok0 + t) * gridDim.x + x]
// (argmax_finish reduces them). Same dots as mma_gemm.
template <class T, int WM, int WN, int N8>
__device__ __forceinline__ void mma_argmax(const u8* __restrict__ w, u64 row_bytes, int n_rows, int k,
                                           const float* __restrict__ x, int n_tok, u64* __restrict__ partials) {
#if __CUDA_ARCH__ >= 800
    if constexpr (CodesFitBf16<T>::value) {
        using S = MmaShape<WM, WN, N8>;
        extern __shared__ __align__(16) u32 mma_smem[];
        __shared__ u64 best[S::TOKENS];
        const int tok0 = blockIdx.z * S::TOKENS, nt = min(S::TOKENS, n_tok - tok0);
        for (int t = threadIdx.x; t < S::TOKENS; t += S::THREADS) best[t] = 0;  // visible after mma_tile's barrier
        KERNEL_PROLOGUE();
        const int warp = threadIdx.x >> 5, wm = warp % WM, wn = warp / WM;
        for (int tile = blockIdx.x * S::ROWS; tile < n_rows; tile += gridDim.x * S::ROWS) {
            float acc[2][N8][4];
            zero_acc(acc);
            mma_tile<T, S, N8>(w + (u64)tile * row_bytes, row_bytes, n_rows - tile, k, x + (size_t)tok0 * k, nt, 0,
                               k >> 3, mma_smem, acc);
            mma_fold_best(acc, tile, n_rows, nt, wm, wn, best);
        }
        __syncthreads();
        for (int tt = threadIdx.x; tt < nt; tt += S::THREADS)
            partials[(size_t)(tok0 + tt) * gridDim.x + blockIdx.x] = best[tt];
    }
#endif
}

// ---- entry points -------------------------------------------------------------

// The CTA shapes the host picks from (MMA_SHAPES in mma.rs), named
// m<rows>n<tokens>.
#define KILN_MMA(WM, WN, N8, NAME)                                                                               \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN)                                                    \
        KILN_CAT(KILN_CAT(mma_gemm, KILN_WEIGHT), NAME)(const u8* w, u64 row_bytes, int row0, int n_rows, int k, \
                                                       const float* x, int n_tok, int units_per_split, float* out) { \
        mma_gemm<KILN_WEIGHT, WM, WN, N8>(w, row_bytes, row0, n_rows, k, x, n_tok, units_per_split, out);       \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN)                                                    \
        KILN_CAT(KILN_CAT(mma_argmax, KILN_WEIGHT), NAME)(const u8* w, u64 row_bytes, int n_rows, int k,         \
                                                         const float* x, int n_tok, u64* partials) {             \
        mma_argmax<KILN_WEIGHT, WM, WN, N8>(w, row_bytes, n_rows, k, x, n_tok, partials);                         \
    }

KILN_MMA(2, 2, 1, m64n16)
KILN_MMA(2, 2, 2, m64n32)
KILN_MMA(2, 2, 4, m64n64)
KILN_MMA(4, 2, 4, m128n64)
KILN_MMA(4, 2, 8, m128n128)
