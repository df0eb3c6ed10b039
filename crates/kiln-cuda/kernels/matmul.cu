// matmul.cu: products with packed weight rows, for one weight type.
//
// The host compiles this file once per GGML type it meets, prepending
// `#define KILN_WEIGHT <type>` (a decoder struct of quant.cuh) and
// quant.cuh itself; every kernel below is a template over that decoder, so
// each operation has one source for all thirteen types. Entry points are
// named `<op>_<type>[_<shape>]`, e.g. matvec_q4_k_t1r2.
//
//   matvec        out[t, r] = dot(W[row0 + r], x[t]) for up to 8 token rows:
//                 the decode GEMV (1 token) and the skinny batched GEMM
//                 (2..8 tokens), each weight byte read once for all tokens.
//   dequant_rows  W[row0 .. row0 + n] as f32 rows, for cuBLAS SGEMM (prefill).
//   embed         out[t] = W[tokens[t]] * scale, ids read on the device.
//   argmax_rows   per-CTA best (dot, row) of W against one x row, and
//   argmax_finish the final reduction into ids[slot]: the greedy LM head
//                 without logits.
//
// skinny.cu follows this file: the tiled kernels of batched decode (2..64
// token rows) and the batch's argmax head.
//
// Layouts: W is `n_rows` rows of `row_bytes` packed bytes (as in the GGUF
// file), `k` elements each, k a multiple of 8; x and out are row-major f32
// with row strides k and n_rows. Accumulation is f32 throughout.

#ifndef KILN_WEIGHT
#error "define KILN_WEIGHT as one of quant.cuh's type structs"
#endif

// Warps per CTA of the row kernels; the host launches WARPS * 32 threads.
constexpr int WARPS = 4;

// Every kernel here is a programmatic dependent launch (Gpu::launch_pdl):
// it may start while the kernel before it still runs. Weights are
// constants (no kernel writes them), so a kernel first asks L2 for its
// first weight bytes, then waits for the writer of x (grid_dep_wait), and
// lets the next kernel launch (grid_dep_launch): the next GEMV's weight
// fetch overlaps this one's arithmetic and tail.

// Starts fetching bytes [p, p + n) into L2, one 128-byte line per lane
// and step; a warp calls it together.
__device__ __forceinline__ void prefetch_l2(const u8* p, u64 n) {
    const u64 first = (u64)p & ~127ull, end = (u64)p + n;
    for (u64 a = first + 128ull * (threadIdx.x & 31); a < end; a += 32 * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
}

__device__ __forceinline__ u64 max_u64(u64 a, u64 b) { return a > b ? a : b; }

// ---- kernels ----------------------------------------------------------------

// One warp's dots of rows row .. row + R (those below n_rows, relative to
// `w`) with token rows 0 .. n_tok (n_tok <= NT) of x; every lane gets the
// sums. Lane l takes the unit pairs (2l, 2l+1), (2l+64, 2l+65), ...: a warp
// reads each row's bytes as one contiguous stream; a pair shares its scales
// (quant.cuh), decoded once; each x unit, loaded once into registers,
// serves all R rows (x is re-read from L1 once per R rows, not per row).
// Per unit: d * sum(q x) + m * sum(x), the sums over its 8 elements.
template <class T, int NT, int R>
__device__ __forceinline__ void warp_dots(const u8* __restrict__ w, u64 row_bytes, int row, int n_rows,
                                          int k, const float* __restrict__ x, int n_tok,
                                          float (&acc)[R][NT]) {
    const u8* rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        rows[r] = w + (u64)(row + r) * row_bytes;
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    }
    const int n_units = k >> 3;
    // Two pairs in flight per lane keep enough loads outstanding; the wide
    // shapes already hold NT x 8 x values and R x NT sums in registers
    // (unrolled, t8r4 would take 224 and fit only 8 warps on an SM).
#pragma unroll(NT * R <= 4 ? 2 : 1)
    for (int u0 = 2 * (threadIdx.x & 31); u0 < n_units; u0 += 64) {
        Affine af[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (row + r >= n_rows) continue;
            int j;
            const u8* blk = unit_block<T>(rows[r], u0, j);
            af[r] = T::affine(blk, j);
        }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int u = u0 + h;
            if (u >= n_units) break;  // an odd unit count (plain types)
            float xv[NT][8], xs[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f), b = a;
                if (t < n_tok) {
                    const float4* p = (const float4*)(x + (size_t)t * k + 8 * u);
                    a = p[0];
                    b = p[1];
                }
                xv[t][0] = a.x, xv[t][1] = a.y, xv[t][2] = a.z, xv[t][3] = a.w;
                xv[t][4] = b.x, xv[t][5] = b.y, xv[t][6] = b.z, xv[t][7] = b.w;
                xs[t] = T::HAS_MIN ? ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w)) : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (row + r >= n_rows) continue;
                float q[8];
                int j;
                const u8* blk = unit_block<T>(rows[r], u, j);
                T::codes(blk, j, q);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= n_tok) continue;
                    float s = 0.0f;
#pragma unroll
                    for (int i = 0; i < 8; i++) s = fmaf(q[i], xv[t][i], s);
                    acc[r][t] = fmaf(af[r].d, s, acc[r][t]);
                    if (T::HAS_MIN) acc[r][t] = fmaf(af[r].m, xs[t], acc[r][t]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
}

// out[t * n_rows + r] = dot(W[row0 + r], x[t]) for r < n_rows, t < n_tok
// (n_tok <= NT). Warp i of the grid takes rows R i .. R i + R. Reads
// n_rows * row_bytes weight bytes once, and x from cache.
template <class T, int NT, int R>
__device__ __forceinline__ void matvec(const u8* __restrict__ w, u64 row_bytes, int row0, int n_rows, int k,
                                       const float* __restrict__ x, int n_tok, float* __restrict__ out) {
    const int row = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * R;
    if (row < n_rows) prefetch_l2(w + (u64)(row0 + row) * row_bytes, (u64)min(R, n_rows - row) * row_bytes);
    KERNEL_PROLOGUE();
    if (row >= n_rows) return;  // whole warps only
    float acc[R][NT];
    warp_dots<T, NT, R>(w + (u64)row0 * row_bytes, row_bytes, row, n_rows, k, x, n_tok, acc);
    // Lane r * NT + t stores (r, t): the stores go out in parallel.
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (lane == r * NT + t && row + r < n_rows && t < n_tok) out[(size_t)t * n_rows + row + r] = acc[r][t];
}

// out[r * k + c] = W[row0 + r][c] for r < n_rows: one thread per unit,
// consecutive threads on consecutive units (coalesced 32-byte stores).
// Bit-identical to kiln-quant's dequantizer.
template <class T>
__device__ __forceinline__ void dequant_rows(const u8* __restrict__ w, u64 row_bytes, int row0, int n_rows, int k,
                                             float* __restrict__ out) {
    const u64 units = (u64)(k >> 3);
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)n_rows * units) return;
    KERNEL_PROLOGUE();  // the workspace may still be read by the last SGEMM
    const u64 r = i / units;
    const int u = (int)(i % units);
    Unit un;
    load_unit<T>(w + (row0 + r) * row_bytes, u, un);
    float4* o = (float4*)(out + r * k + 8 * u);
    o[0] = make_float4(unit_weight<T>(un, 0), unit_weight<T>(un, 1), unit_weight<T>(un, 2), unit_weight<T>(un, 3));
    o[1] = make_float4(unit_weight<T>(un, 4), unit_weight<T>(un, 5), unit_weight<T>(un, 6), unit_weight<T>(un, 7));
}

// out[t * k + c] = W[tokens[t]][c] * scale (the product rounded once, as
// on the CPU). An id past the table (load_step rejects those) yields NaN,
// never a read out of bounds. Grid: x over units, y strides over tokens.
template <class T>
__device__ __forceinline__ void embed(const u8* __restrict__ w, u64 row_bytes, int n_rows, int k,
                                      const u32* __restrict__ tokens, int n_tok, float scale,
                                      float* __restrict__ out) {
    KERNEL_PROLOGUE();
    const int u = blockIdx.x * blockDim.x + threadIdx.x;
    if (u >= (k >> 3)) return;
    for (int t = blockIdx.y; t < n_tok; t += gridDim.y) {
        const u32 id = tokens[t];
        float v[8];
        if (id < (u32)n_rows) {
            Unit un;
            load_unit<T>(w + (u64)id * row_bytes, u, un);
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = __fmul_rn(unit_weight<T>(un, i), scale);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++) v[i] = __uint_as_float(0x7fc00000u);
        }
        float4* o = (float4*)(out + (size_t)t * k + 8 * u);
        o[0] = make_float4(v[0], v[1], v[2], v[3]);
        o[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

// The argmax order as one integer: a larger dot, then a lower row, gives a
// larger key, so partial results combine by max in any order. A NaN or
// infinite dot gives ARGMAX_BAD, above every finite key; 0 is "no row".
constexpr u64 ARGMAX_BAD = ~0ull;

__device__ __forceinline__ u64 argmax_key(float v, u32 row) {
    const u32 bits = __float_as_uint(v + 0.0f);  // -0 -> +0: equal dots tie on the row
    if ((bits & 0x7f800000u) == 0x7f800000u) return ARGMAX_BAD;
    const u32 ordered = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ((u64)ordered << 32) | (u64)(~row);
}

// Rows per warp and step of argmax_rows (ARGMAX_ROWS in matmul.rs).
constexpr int ARGMAX_ROWS = 4;

// partials[blockIdx.x] = the largest key over the rows this CTA visits:
// its warps stride over groups of ARGMAX_ROWS rows, so a grid smaller than
// the matrix still covers it (the host caps the grid at the partials'
// size). Each step asks L2 for the next group's rows before reading its
// own, so two groups' bytes are in flight per warp.
template <class T>
__device__ __forceinline__ void argmax_rows(const u8* __restrict__ w, u64 row_bytes, int n_rows, int k,
                                            const float* __restrict__ x, u64* __restrict__ partials) {
    constexpr int R = ARGMAX_ROWS;
    const int warp = threadIdx.x >> 5;
    const int stride = gridDim.x * WARPS * R;
    const int first = (blockIdx.x * WARPS + warp) * R;
    if (first < n_rows) prefetch_l2(w + (u64)first * row_bytes, (u64)min(R, n_rows - first) * row_bytes);
    KERNEL_PROLOGUE();
    u64 best = 0;
    for (int row = first; row < n_rows; row += stride) {
        if (row < n_rows - stride)
            prefetch_l2(w + (u64)(row + stride) * row_bytes, (u64)min(R, n_rows - row - stride) * row_bytes);
        float acc[R][1];
        warp_dots<T, 1, R>(w, row_bytes, row, n_rows, k, x, 1, acc);
#pragma unroll
        for (int r = 0; r < R; r++)
            if (row + r < n_rows) best = max_u64(best, argmax_key(acc[r][0], (u32)(row + r)));
    }
    __shared__ u64 warp_best[WARPS];
    if ((threadIdx.x & 31) == 0) warp_best[warp] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 b = warp_best[0];
#pragma unroll
        for (int i = 1; i < WARPS; i++) b = max_u64(b, warp_best[i]);
        partials[blockIdx.x] = b;
    }
}

// ---- entry points -------------------------------------------------------------

#define KILN_CAT_(a, b) a##_##b
#define KILN_CAT(a, b) KILN_CAT_(a, b)
#define KILN_ENTRY(op, threads) extern "C" __global__ void __launch_bounds__(threads) KILN_CAT(op, KILN_WEIGHT)

#define KILN_MATVEC(NT, R)                                                                                 \
    extern "C" __global__ void __launch_bounds__(WARPS * 32) KILN_CAT(KILN_CAT(matvec, KILN_WEIGHT), t##NT##r##R)( \
        const u8* w, u64 row_bytes, int row0, int n_rows, int k, const float* x, int n_tok, float* out) {  \
        matvec<KILN_WEIGHT, NT, R>(w, row_bytes, row0, n_rows, k, x, n_tok, out);                        \
    }

// The (tokens, rows per warp) shapes the host picks from (matmul.rs):
// rows per warp trade x reuse against parallelism for short matrices.
KILN_MATVEC(1, 1)
KILN_MATVEC(1, 2)
KILN_MATVEC(2, 2)
KILN_MATVEC(4, 4)
KILN_MATVEC(8, 4)

KILN_ENTRY(dequant_rows, WARPS * 32)(const u8* w, u64 row_bytes, int row0, int n_rows, int k, float* out) {
    dequant_rows<KILN_WEIGHT>(w, row_bytes, row0, n_rows, k, out);
}

KILN_ENTRY(embed, WARPS * 32)(const u8* w, u64 row_bytes, int n_rows, int k, const u32* tokens, int n_tok, float scale,
                  float* out) {
    embed<KILN_WEIGHT>(w, row_bytes, n_rows, k, tokens, n_tok, scale, out);
}

KILN_ENTRY(argmax_rows, WARPS * 32)(const u8* w, u64 row_bytes, int n_rows, int k, const float* x, u64* partials) {
    argmax_rows<KILN_WEIGHT>(w, row_bytes, n_rows, k, x, partials);
}

// ids[slot + b] = the row of the largest key in partials[b n .. b n + n]
// (CTA b of ARGMAX_FINISH_THREADS; one CTA per x row), or u32::MAX when
// any dot was not finite.
constexpr int ARGMAX_FINISH_THREADS = 256;

KILN_ENTRY(argmax_finish, ARGMAX_FINISH_THREADS)(const u64* partials, int n, u32* ids, int slot) {
    __shared__ u64 best[ARGMAX_FINISH_THREADS];
    KERNEL_PROLOGUE();
    // CTA b reduces the b-th run of n partials into ids[slot + b].
    partials += (size_t)blockIdx.x * n;
    slot += blockIdx.x;
    u64 b = 0;
    for (int i = threadIdx.x; i < n; i += ARGMAX_FINISH_THREADS) b = max_u64(b, partials[i]);
    best[threadIdx.x] = b;
    __syncthreads();
    for (int s = ARGMAX_FINISH_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) best[threadIdx.x] = max_u64(best[threadIdx.x], best[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) ids[slot] = (best[0] == ARGMAX_BAD || best[0] == 0) ? 0xffffffffu : ~(u32)best[0];
}
