// skinny.cu: the batched-decode products, appended to matmul.cu (same
// weight type, same helpers). A batched decode step multiplies every weight
// by S = 2..64 token rows: from S ~ 4 on, f32 FMAs rather than weight bytes
// bound a GEMV-shaped kernel, so these kernels tile like an SGEMM.
//
//   gemm          out[t, r] = dot(W[row0 + r], x[t]) for S <= 64 token rows:
//                 a CTA dequantizes a 64-row x 64-column weight tile into
//                 shared memory once for all its tokens' x tile; a matrix
//                 too short to fill the GPU is split along k into partial
//                 sums that gemm_split_sum adds in split order.
//   argmax_tiles  per-CTA best (dot, row) of W against each of S x rows,
//   argmax_finish (matmul.cu) then one id per row: the greedy LM head of a
//                 batch, every head row read once for all S rows.
//
// Arithmetic: weights are dequantized exactly as kiln-quant's dequantizer
// (unit_weight), then each output is one f32 FMA chain over k in order
// (a split adds its few chains at the end), like an SGEMM on the
// dequantized rows.

// Rows and columns (8-value units) of a CTA's weight tile, and its threads.
constexpr int TILE_ROWS = 64;
constexpr int TILE_K = 64;
constexpr int TILE_UNITS = TILE_K / 8;
constexpr int TILE_THREADS = 256;
// Shared-memory row stride: float4-aligned, and 4 banks apart from the next
// row, so eight lanes reading consecutive rows' float4s hit all 32 banks.
constexpr int TILE_STRIDE = TILE_K + 4;

// How a CTA's threads split its TILE_ROWS x NT outputs: thread (rg, tg),
// rg = tid % TR, takes rows rg + i TR (i < RM) and tokens tg + j TT (j < RT).
// The threads of one tg are TR >= 16 consecutive lanes of one warp.
template <int NT>
struct TileShape {
    static constexpr int RM = NT >= 16 ? 4 : 2;
    static constexpr int RT = NT >= 16 ? NT / 16 : 1;
    static constexpr int TR = TILE_ROWS / RM, TT = NT / RT;
    static_assert(TR * TT == TILE_THREADS, "one output block per thread");
};

// acc[i][j] += sum over the 64 columns from unit u0 of w_row(rg + i TR)
// times x[tg + j TT], where w_row(r) is row r of `w` (rows at or past
// n_rows, units at or past u_end and tokens at or past n_tok count as 0).
// The CTA calls it together: it stages the weight tile (dequantized) and
// the x tile in shared memory between two barriers.
template <class T, int NT>
__device__ __forceinline__ void tile_step(const u8* __restrict__ w, u64 row_bytes, int n_rows, int k, int u0,
                                          int u_end, const float* __restrict__ x, int n_tok,
                                          float (&acc)[TileShape<NT>::RM][TileShape<NT>::RT]) {
    using S = TileShape<NT>;
    __shared__ __align__(16) float ws[TILE_ROWS * TILE_STRIDE];
    __shared__ __align__(16) float xs[NT * TILE_STRIDE];
    const int tid = threadIdx.x;
    __syncthreads();  // the previous step has read the tiles
    // Weights: unit tid % 8 of rows tid / 8 and tid / 8 + 32 (eight lanes
    // read one row's bytes together).
#pragma unroll
    for (int p = 0; p < TILE_ROWS * TILE_UNITS / TILE_THREADS; p++) {
        const int r = tid / TILE_UNITS + p * (TILE_THREADS / TILE_UNITS);
        const int uu = tid % TILE_UNITS, u = u0 + uu;
        float v[8];
        if (r < n_rows && u < u_end) {
            Unit un;
            load_unit<T>(w + (u64)r * row_bytes, u, un);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = unit_weight<T>(un, e);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = 0.0f;
        }
        float4* dst = (float4*)(ws + r * TILE_STRIDE + 8 * uu);
        dst[0] = make_float4(v[0], v[1], v[2], v[3]);
        dst[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    // x: NT rows of TILE_K values, as float4s.
    for (int i = tid; i < NT * (TILE_K / 4); i += TILE_THREADS) {
        const int t = i / (TILE_K / 4), q = i % (TILE_K / 4);
        const int c = 8 * u0 + 4 * q;
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (t < n_tok && c < 8 * u_end) v = *(const float4*)(x + (size_t)t * k + c);
        *(float4*)(xs + t * TILE_STRIDE + 4 * q) = v;
    }
    __syncthreads();
    const int rg = tid % S::TR, tg = tid / S::TR;
    if (tg >= n_tok) return;  // only absent tokens: skip their FMAs
#pragma unroll 4
    for (int kk = 0; kk < TILE_K; kk += 4) {
        float4 a[S::RM], b[S::RT];
#pragma unroll
        for (int i = 0; i < S::RM; i++) a[i] = *(const float4*)(ws + (rg + i * S::TR) * TILE_STRIDE + kk);
#pragma unroll
        for (int j = 0; j < S::RT; j++) b[j] = *(const float4*)(xs + (tg + j * S::TT) * TILE_STRIDE + kk);
#pragma unroll
        for (int i = 0; i < S::RM; i++)
#pragma unroll
            for (int j = 0; j < S::RT; j++) {
                float s = acc[i][j];
                s = fmaf(a[i].x, b[j].x, s);
                s = fmaf(a[i].y, b[j].y, s);
                s = fmaf(a[i].z, b[j].z, s);
                acc[i][j] = fmaf(a[i].w, b[j].w, s);
            }
    }
}

// Asks L2 for units [u_begin, u_end) of this warp's eighth of the tile's
// rows (whole blocks: a K-quant unit range rounds out to its super-blocks).
template <class T>
__device__ __forceinline__ void prefetch_tile(const u8* w, u64 row_bytes, int n_rows, int u_begin, int u_end) {
    constexpr int UNITS = T::QK / 8;
    const u64 b0 = (u64)(u_begin / UNITS) * T::BYTES, b1 = (u64)((u_end + UNITS - 1) / UNITS) * T::BYTES;
    const int r0 = (threadIdx.x >> 5) * (TILE_ROWS / 8);
    for (int r = r0; r < min(r0 + TILE_ROWS / 8, n_rows); r++) prefetch_l2(w + (u64)r * row_bytes + b0, b1 - b0);
}

// CTA (x, y, z) computes rows 64 x .. 64 x + 64 (of the n_rows from row0)
// against tokens NT z .. NT z + NT, over units y * units_per_split ..
// (y + 1) * units_per_split. With one split it writes out[t * n_rows + r];
// with more, the split's partial sums at out[(y * n_tok + t) * n_rows + r]
// (gemm_split_sum adds them).
template <class T, int NT>
__device__ __forceinline__ void gemm(const u8* __restrict__ w, u64 row_bytes, int row0, int n_rows, int k,
                                     const float* __restrict__ x, int n_tok, int units_per_split,
                                     float* __restrict__ out) {
    using S = TileShape<NT>;
    const int tile = blockIdx.x * TILE_ROWS, tok0 = blockIdx.z * NT;
    const int u_begin = blockIdx.y * units_per_split, u_end = min(k >> 3, u_begin + units_per_split);
    const u8* wt = w + (u64)(row0 + tile) * row_bytes;
    prefetch_tile<T>(wt, row_bytes, n_rows - tile, u_begin, u_end);
    KERNEL_PROLOGUE();
    const int nt = min(NT, n_tok - tok0);
    float acc[S::RM][S::RT];
#pragma unroll
    for (int i = 0; i < S::RM; i++)
#pragma unroll
        for (int j = 0; j < S::RT; j++) acc[i][j] = 0.0f;
    for (int u0 = u_begin; u0 < u_end; u0 += TILE_UNITS)
        tile_step<T, NT>(wt, row_bytes, n_rows - tile, k, u0, u_end, x + (size_t)tok0 * k, nt, acc);
    float* dst = out + (size_t)blockIdx.y * n_tok * n_rows;
    const int rg = threadIdx.x % S::TR, tg = threadIdx.x / S::TR;
#pragma unroll
    for (int i = 0; i < S::RM; i++)
#pragma unroll
        for (int j = 0; j < S::RT; j++) {
            const int r = tile + rg + i * S::TR, t = tg + j * S::TT;
            if (r < n_rows && t < nt) dst[(size_t)(tok0 + t) * n_rows + r] = acc[i][j];
        }
}

// CTA (b, z) takes row tiles b, b + gridDim.x, ... of all n_rows rows and
// tokens NT z .. NT z + NT, and writes partials[t * gridDim.x + b] = the
// largest argmax_key over its rows for each token t. The next tile's rows
// are asked of L2 while the current one is computed.
template <class T, int NT>
__device__ __forceinline__ void argmax_tiles(const u8* __restrict__ w, u64 row_bytes, int n_rows, int k,
                                             const float* __restrict__ x, int n_tok, u64* __restrict__ partials) {
    using S = TileShape<NT>;
    const int n_units = k >> 3, tok0 = blockIdx.y * NT, step = gridDim.x * TILE_ROWS;
    const int first = blockIdx.x * TILE_ROWS;
    if (first < n_rows) prefetch_tile<T>(w + (u64)first * row_bytes, row_bytes, n_rows - first, 0, n_units);
    KERNEL_PROLOGUE();
    const int nt = min(NT, n_tok - tok0);
    const int rg = threadIdx.x % S::TR, tg = threadIdx.x / S::TR;
    u64 best[S::RT];
#pragma unroll
    for (int j = 0; j < S::RT; j++) best[j] = 0;
    for (int tile = first; tile < n_rows; tile += step) {
        if (tile + step < n_rows)
            prefetch_tile<T>(w + (u64)(tile + step) * row_bytes, row_bytes, n_rows - tile - step, 0, n_units);
        float acc[S::RM][S::RT];
#pragma unroll
        for (int i = 0; i < S::RM; i++)
#pragma unroll
            for (int j = 0; j < S::RT; j++) acc[i][j] = 0.0f;
        const u8* wt = w + (u64)tile * row_bytes;
        for (int u0 = 0; u0 < n_units; u0 += TILE_UNITS)
            tile_step<T, NT>(wt, row_bytes, n_rows - tile, k, u0, n_units, x + (size_t)tok0 * k, nt, acc);
#pragma unroll
        for (int i = 0; i < S::RM; i++)
#pragma unroll
            for (int j = 0; j < S::RT; j++) {
                const int r = tile + rg + i * S::TR;
                if (r < n_rows) best[j] = max_u64(best[j], argmax_key(acc[i][j], (u32)r));
            }
    }
    // The TR lanes of one tg are an aligned group of one warp.
#pragma unroll
    for (int j = 0; j < S::RT; j++) {
#pragma unroll
        for (int o = S::TR / 2; o > 0; o >>= 1) best[j] = max_u64(best[j], __shfl_xor_sync(FULL_MASK, best[j], o));
        const int t = tg + j * S::TT;
        if (rg == 0 && t < nt) partials[(size_t)(tok0 + t) * gridDim.x + blockIdx.x] = best[j];
    }
}

// ---- entry points -------------------------------------------------------------

// The token tiles the host picks from (GEMM_TOKENS in matmul.rs): the
// smallest that holds the step's rows.
#define KILN_SKINNY(NT)                                                                                          \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS)                                                    \
        KILN_CAT(KILN_CAT(gemm, KILN_WEIGHT), t##NT)(const u8* w, u64 row_bytes, int row0, int n_rows, int k,      \
                                                    const float* x, int n_tok, int units_per_split, float* out) { \
        gemm<KILN_WEIGHT, NT>(w, row_bytes, row0, n_rows, k, x, n_tok, units_per_split, out);                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(TILE_THREADS)                                                    \
        KILN_CAT(KILN_CAT(argmax_tiles, KILN_WEIGHT), t##NT)(const u8* w, u64 row_bytes, int n_rows, int k,        \
                                                            const float* x, int n_tok, u64* partials) {           \
        argmax_tiles<KILN_WEIGHT, NT>(w, row_bytes, n_rows, k, x, n_tok, partials);                               \
    }

KILN_SKINNY(8)
KILN_SKINNY(16)
KILN_SKINNY(32)
KILN_SKINNY(64)

// out[i] = sum over the n_split partial sums part[z * n + i], in split order.
KILN_ENTRY(gemm_split_sum, WARPS * 32)(const float* part, int n_split, int n, float* out) {
    KERNEL_PROLOGUE();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float s = part[i];
        for (int z = 1; z < n_split; z++) s += part[(size_t)z * n + i];
        out[i] = s;
    }
}
