// mma.cu: the tensor-core GEMM of large batched-decode products (mma.rs
// says which; with KILN_CUDA_MMA=all, prefill too), appended to matmul.cu
// (same weight type, same helpers).
//
//   mma_gemm      out[t, r] = dot(W[row0 + r], x[t]) for any number of
//                 token rows: a CTA dequantizes a weight tile (rows x 32
//                 columns) into shared memory with unit_weight, the same
//                 values as kiln-quant's dequantizer, stages the tokens' x
//                 tile beside it, and multiplies the two on the tensor
//                 cores (mma.sync m16n8k8, TF32 operands, f32
//                 accumulators). Split along k like skinny.cu's gemm (the
//                 partial sums go through gemm_split_sum).
//
// Exactness: split-operand 3xTF32. Each f32 operand a is split into
// hi = tf32(a) (10 mantissa bits, rounded to nearest) and lo = tf32(a - hi)
// (a - hi is exact in f32), and every product is taken as
// lo_w hi_x + hi_w lo_x + hi_w hi_x with f32 accumulation: the dropped
// lo_w lo_x and lo's own rounding are ~2^-21 of |w x|, so a dot keeps close
// to full f32 accuracy (tests/matmul.rs holds it to 1e-5 of sum |w x|, as
// the f32 kernels). Plain TF32 (one product) would keep only ~2^-11.
// A non-finite weight or input gives NaN (inf - inf in the split), never a
// finite value. Needs sm_80 (cvt.rna.tf32, TF32 mma); below that the body
// compiles to nothing and the host never launches it (mma.rs).

// Elements of a k step (four 8-value units). Shared memory holds each
// operand already split, as {hi, lo} pairs (one 8-byte load per fragment
// element); the row stride of 36 pairs puts each 16-lane phase of a
// fragment load (rows g, g + 1, .., columns t) on distinct banks and keeps
// rows 16-byte aligned.
constexpr int MMA_K = 32;
constexpr int MMA_K_UNITS = MMA_K / 8;
constexpr int MMA_STRIDE = MMA_K + 4;

// v = hi + lo with hi, lo TF32 values (the low 13 bits zero), as a pair.
__device__ __forceinline__ uint2 split_tf32(float v) {
    uint2 r = make_uint2(0u, 0u);
#if __CUDA_ARCH__ >= 800
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.x) : "f"(v));
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r.y) : "f"(v - __uint_as_float(r.x)));
#endif
    return r;
}

// Four values, split, as two 16-byte stores of {hi, lo} pairs.
__device__ __forceinline__ void store_split4(uint2* dst, float a, float b, float c, float d) {
    const uint2 sa = split_tf32(a), sb = split_tf32(b), sc = split_tf32(c), sd = split_tf32(d);
    ((uint4*)dst)[0] = make_uint4(sa.x, sa.y, sb.x, sb.y);
    ((uint4*)dst)[1] = make_uint4(sc.x, sc.y, sd.x, sd.y);
}

// c += a b for one 16 x 8 x 8 TF32 tile (PTX fragment layouts: lane
// (g, t) = (lane / 4, lane % 4) holds A (g, t), (g + 8, t), (g, t + 4),
// (g + 8, t + 4); B (k t, n g), (k t + 4, n g); C (g, 2t), (g, 2t + 1),
// (g + 8, 2t), (g + 8, 2t + 1)).
__device__ __forceinline__ void mma_tf32(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// A CTA of WM x WN warps; warp (wm, wn) computes weight rows 32 wm .. +32
// against tokens 8 N8 wn .. +8 N8 (2 x N8 MMA tiles). The CTA covers ROWS
// weight rows and TOKENS tokens.
template <int WM, int WN, int N8>
struct MmaShape {
    static constexpr int ROWS = 32 * WM, TOKENS = 8 * N8 * WN, THREADS = 32 * WM * WN;
    // Units of the weight tile and float4s of the x tile per thread (the
    // last pass of the x loop may be partial).
    static constexpr int W_PASSES = ROWS * MMA_K_UNITS / THREADS;
    static constexpr int X_PASSES = (TOKENS * MMA_K / 4 + THREADS - 1) / THREADS;
    static_assert(ROWS * MMA_K_UNITS % THREADS == 0, "whole units per thread");
};

// The next k step's operands, held in registers while the current one is
// multiplied: W_PASSES dequantized units and X_PASSES float4s of x.
template <class S>
struct MmaStage {
    float w[S::W_PASSES][8];
    float4 x[S::X_PASSES];
};

// Loads the k step from unit u0 (units at or past u_end, rows at or past
// n_rows and tokens at or past n_tok as zeros) into `st`. Branch-free (an
// absent element reads a present one's address, then selects 0), so the
// compiler may issue the loads before the previous step's MMAs and decode
// after them.
template <class T, class S>
__device__ __forceinline__ void mma_load(const u8* __restrict__ w, u64 row_bytes, int n_rows, int k, int u0,
                                         int u_end, const float* __restrict__ x, int n_tok, MmaStage<S>& st) {
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int p = 0; p < S::X_PASSES; p++) {
        const int i = threadIdx.x + p * S::THREADS;
        const int t = i / (MMA_K / 4), c = 8 * u0 + 4 * (i % (MMA_K / 4));
        const bool ok = i < S::TOKENS * MMA_K / 4 && t < n_tok && c < 8 * u_end;
        const float4 v = *(const float4*)(x + (size_t)min(t, n_tok - 1) * k + min(c, 8 * u_end - 4));
        st.x[p] = ok ? v : zero;
    }
    // Four consecutive threads read one row's four units (contiguous bytes).
#pragma unroll
    for (int p = 0; p < S::W_PASSES; p++) {
        const int i = threadIdx.x + p * S::THREADS;
        const int r = i / MMA_K_UNITS, u = u0 + i % MMA_K_UNITS;
        const bool ok = r < n_rows && u < u_end;
        Unit un;
        load_unit<T>(w + (u64)min(r, n_rows - 1) * row_bytes, min(u, u_end - 1), un);
#pragma unroll
        for (int e = 0; e < 8; e++) st.w[p][e] = ok ? unit_weight<T>(un, e) : 0.0f;
    }
}

// Splits the staged step into the shared tiles ws (S::ROWS rows) and xs
// (S::TOKENS rows), MMA_STRIDE pairs apart.
template <class S>
__device__ __forceinline__ void mma_store(const MmaStage<S>& st, uint2* ws, uint2* xs) {
#pragma unroll
    for (int p = 0; p < S::X_PASSES; p++) {
        const int i = threadIdx.x + p * S::THREADS;
        const float4 v = st.x[p];
        if (i < S::TOKENS * MMA_K / 4)
            store_split4(xs + (i / (MMA_K / 4)) * MMA_STRIDE + 4 * (i % (MMA_K / 4)), v.x, v.y, v.z, v.w);
    }
#pragma unroll
    for (int p = 0; p < S::W_PASSES; p++) {
        const int i = threadIdx.x + p * S::THREADS;
        uint2* d = ws + (i / MMA_K_UNITS) * MMA_STRIDE + 8 * (i % MMA_K_UNITS);
        store_split4(d, st.w[p][0], st.w[p][1], st.w[p][2], st.w[p][3]);
        store_split4(d + 4, st.w[p][4], st.w[p][5], st.w[p][6], st.w[p][7]);
    }
}

// acc += this warp's block of ws · xsᵀ over the MMA_K columns in shared
// memory, in 3xTF32.
template <int N8>
__device__ __forceinline__ void mma_step(const uint2* ws, const uint2* xs, float (&acc)[2][N8][4]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int kk = 0; kk < MMA_K; kk += 8) {
        u32 a_hi[2][4], a_lo[2][4], b_hi[N8][2], b_lo[N8][2];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const uint2* p = ws + (16 * mi + g) * MMA_STRIDE + kk + t;
            const uint2 v[4] = {p[0], p[8 * MMA_STRIDE], p[4], p[8 * MMA_STRIDE + 4]};
#pragma unroll
            for (int e = 0; e < 4; e++) a_hi[mi][e] = v[e].x, a_lo[mi][e] = v[e].y;
        }
#pragma unroll
        for (int ni = 0; ni < N8; ni++) {
            const uint2* p = xs + (8 * ni + g) * MMA_STRIDE + kk + t;
            const uint2 v0 = p[0], v1 = p[4];
            b_hi[ni][0] = v0.x, b_lo[ni][0] = v0.y, b_hi[ni][1] = v1.x, b_lo[ni][1] = v1.y;
        }
        // Small terms first, then the leading one.
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int ni = 0; ni < N8; ni++) {
                mma_tf32(acc[mi][ni], a_lo[mi], b_hi[ni]);
                mma_tf32(acc[mi][ni], a_hi[mi], b_lo[ni]);
                mma_tf32(acc[mi][ni], a_hi[mi], b_hi[ni]);
            }
    }
}

// CTA (x, y, z) computes weight rows S::ROWS x .. + S::ROWS (of the n_rows
// from row0) against tokens S::TOKENS z .. + S::TOKENS, over units
// y * units_per_split .. (y + 1) * units_per_split (a multiple of
// MMA_K_UNITS). With one split it writes out[t * n_rows + r]; with more,
// the split's partial sums at out[(y * n_tok + t) * n_rows + r].
// Per k step the CTA reads S::ROWS x 32 weights (once per token tile) and
// S::TOKENS x 32 x values (once per row tile).
template <class T, int WM, int WN, int N8>
__device__ __forceinline__ void mma_gemm(const u8* __restrict__ w, u64 row_bytes, int row0, int n_rows, int k,
                                         const float* __restrict__ x, int n_tok, int units_per_split,
                                         float* __restrict__ out) {
#if __CUDA_ARCH__ >= 800
    using S = MmaShape<WM, WN, N8>;
    // (S::ROWS + S::TOKENS) * MMA_STRIDE pairs (mma.rs sizes the launch;
    // above 48 KiB it opts in).
    extern __shared__ __align__(16) uint2 mma_smem[];
    uint2* ws = mma_smem;
    uint2* xs = mma_smem + S::ROWS * MMA_STRIDE;
    const int tile = blockIdx.x * S::ROWS, tok0 = blockIdx.z * S::TOKENS;
    const int u_begin = blockIdx.y * units_per_split, u_end = min(k >> 3, u_begin + units_per_split);
    const u8* wt = w + (u64)(row0 + tile) * row_bytes;
    const float* xt = x + (size_t)tok0 * k;
    const int rows = n_rows - tile, nt = min(S::TOKENS, n_tok - tok0);
    KERNEL_PROLOGUE();
    const int warp = threadIdx.x >> 5, wm = warp % WM, wn = warp / WM;
    float acc[2][N8][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < N8; ni++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][ni][c] = 0.0f;
    MmaStage<S> st;
    mma_load<T, S>(wt, row_bytes, rows, k, u_begin, u_end, xt, nt, st);
    for (int u0 = u_begin; u0 < u_end; u0 += MMA_K_UNITS) {
        __syncthreads();  // the previous step has read the tiles
        mma_store<S>(st, ws, xs);
        __syncthreads();
        // The next step's loads are in flight while this one multiplies.
        // (Past the end it reloads the last units: in bounds, never stored.)
        mma_load<T, S>(wt, row_bytes, rows, k, min(u0 + MMA_K_UNITS, u_end - 1), u_end, xt, nt, st);
        mma_step<N8>(ws + 32 * wm * MMA_STRIDE, xs + 8 * N8 * wn * MMA_STRIDE, acc);
    }
    float* dst = out + (size_t)blockIdx.y * n_tok * n_rows;
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
    }

KILN_MMA(2, 2, 1, m64n16)
KILN_MMA(2, 2, 2, m64n32)
KILN_MMA(2, 2, 4, m64n64)
KILN_MMA(4, 2, 4, m128n64)
