// stream.cu: products with few x rows that stream packed weight rows
// through shared memory, appended to matmul.cu (same weight type, same
// helpers).
//
//   stream_matvec  out[r] = dot(W[row0 + r], x): the decode GEMV.
//   stream_argmax  ids[slot + t] = the row of the largest dot(W[r], x[t])
//                  for up to 4 x rows: the greedy LM head, finished by the
//                  grid's last CTA (no second kernel).
//
// A CTA takes tiles of `tile_rows` consecutive rows (tiles blockIdx.x,
// blockIdx.x + gridDim.x, ...). Each tile's bytes are copied into shared
// memory with 16-byte asynchronous copies (cp.async: whole cache lines,
// many in flight per thread); a CTA that takes several tiles has two
// stages, so the next tile arrives while this one is computed (the host
// gives a CTA that takes one tile a single stage). Weights are constants, so the first tile is
// requested before grid_dep_wait(): a small matrix is already on the SM
// when the kernel that writes x finishes. The warps then take groups of R
// rows of the tile; lane l takes units l, l + 32, ... of each row, one x
// unit (from L1) serving all R rows, one decoded unit all x rows. Per unit: d * sum(q x) + m * sum(x),
// the sums over its 8 elements, as warp_dots.
//
// A tile of fewer row groups than warps (few long rows: the down
// projections) may have up to `max_parts` warps split a group's units and
// add their sums through shared memory, so every warp has work. The dots'
// policy says whether rows are staged at all: qdot.cu's read their rows
// straight from global memory (occupancy then bound by registers, not by
// the stages' shared memory), each form a kernel of its own, so neither
// pays the other's registers.
//
// Tiles start wherever their first row does: the copy starts at the 16-byte
// boundary below it, so a row keeps its address modulo 16 in shared memory
// and quant.cuh's aligned loads stay valid. Bytes past the weight's end
// are never read (the last partial 16 bytes are copied byte by byte).

constexpr int STREAM_WARPS = 4;

// 16 bytes from global to shared memory, asynchronously where the GPU has
// cp.async (sm_80 on); complete after cp_async_wait.
__device__ __forceinline__ void cp_async16(u8* smem, const u8* gmem) {
#if __CUDA_ARCH__ >= 800
    u64 s;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)s), "l"(gmem) : "memory");
#else
    *(uint4*)smem = *(const uint4*)gmem;
#endif
}

// Closes this thread's group of copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most N of this thread's groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// Where a tile of rows lies: its first byte in global memory and its
// offset in its stage (the first byte's address modulo 16).
struct TileSpan {
    const u8* first;
    u32 offset, rows;
};

__device__ __forceinline__ TileSpan tile_span(const u8* w, u64 row_bytes, int n_rows, int tile_rows, int tile) {
    const int r0 = tile * tile_rows;
    TileSpan s;
    s.first = w + (u64)r0 * row_bytes;
    s.offset = (u32)((u64)s.first & 15);
    s.rows = (u32)min(tile_rows, n_rows - r0);
    return s;
}

// Issues the copy of a tile into `stage` (the whole CTA; one commit per
// thread). `end` is the weight's last byte + 1.
__device__ __forceinline__ void stage_tile(u8* stage, const TileSpan& s, u64 row_bytes, const u8* end) {
    const u8* src = s.first - s.offset;
    const u32 n = (u32)((s.offset + s.rows * row_bytes + 15) / 16);
    for (u32 c = threadIdx.x; c < n; c += blockDim.x) {
        const u8* g = src + 16 * c;
        if (g + 16 <= end) {
            cp_async16(stage + 16 * c, g);
        } else {
            for (u32 i = 0; g + i < end; i++) stage[16 * c + i] = g[i];  // the weight's last bytes
        }
    }
    cp_async_commit();
}

// This warp's dots of rows 0 .. n (n <= R) at `rows` (shared or global
// memory, stride row_bytes) with x rows 0 .. n_tok (n_tok <= NT, stride k),
// over units part, part + parts, ... of each 32 (the warp's share when
// `parts` warps split the rows); every lane gets the sums.
template <class T, int NT, int R>
__device__ __forceinline__ void stage_dots(const u8* rows, u64 row_bytes, int n, int k, const float* __restrict__ x,
                                           int n_tok, int part, int parts, float (&acc)[R][NT]) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    const int n_units = k >> 3;
    // One token: two units in flight per lane, their loads overlapping (a
    // lone warp's dependent chain bounds the short GEMVs). More tokens
    // hold NT x 8 x values in registers already.
#pragma unroll(NT == 1 ? 2 : 1)
    for (int u = (threadIdx.x & 31) + 32 * part; u < n_units; u += 32 * parts) {
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
            if (r >= n) break;
            Unit un;
            load_unit<T>(rows + (u64)r * row_bytes, u, un);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= n_tok) continue;
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++) s = fmaf(un.q[i], xv[t][i], s);
                acc[r][t] = fmaf(un.a.d, s, acc[r][t]);
                if (T::HAS_MIN) acc[r][t] = fmaf(un.a.m, xs[t], acc[r][t]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
}

// The dots of a warp's rows: stage_dots (f32 x), or qdot.cu's integer
// dots on x split into int8 planes.
struct F32Dots {
    static constexpr bool STAGED = true;
    template <class T, int NT, int R>
    static __device__ __forceinline__ void run(const u8* rows, u64 row_bytes, int n, int k, const float* x, int n_tok,
                                               int part, int parts, float (&acc)[R][NT]) {
        stage_dots<T, NT, R>(rows, row_bytes, n, k, x, n_tok, part, parts, acc);
    }
};

// Streams rows 0 .. n_rows of `w` (through shared memory where
// Dots::STAGED, stage_bytes a stage) and calls `visit(row, t, dot)` for
// each row's dot with x row t < n_tok, in every lane of the warp that
// computed it.
template <class T, int NT, int R, class Dots = F32Dots, class Visit>
__device__ __forceinline__ void stream_rows(const u8* __restrict__ w, u64 row_bytes, const u8* end, int n_rows,
                                            int k, int tile_rows, u32 stage_bytes, int max_parts,
                                            const float* __restrict__ x, int n_tok, Visit visit) {
    extern __shared__ __align__(16) u8 stages[];
    __shared__ float part_acc[STREAM_WARPS][R][NT];
    constexpr bool staged = Dots::STAGED;
    const int n_tiles = (n_rows + tile_rows - 1) / tile_rows;
    int tile = blockIdx.x;
    if (staged && tile < n_tiles) stage_tile(stages, tile_span(w, row_bytes, n_rows, tile_rows, tile), row_bytes, end);
    KERNEL_PROLOGUE();
    const int warp = threadIdx.x >> 5;
    for (int i = 0; tile < n_tiles; i++, tile += gridDim.x) {
        const TileSpan s = tile_span(w, row_bytes, n_rows, tile_rows, tile);
        // The tile's dots, from `rows` (written out twice below, so each
        // copy knows its loads' memory space: shared or global).
        auto dots = [&](const u8* rows) {
            // Warps per row group: the largest power of two up to
            // max_parts that gives every warp a share.
            const int groups = ((int)s.rows + R - 1) / R;
            int parts = 1;
            while (2 * parts * groups <= STREAM_WARPS && 2 * parts <= max_parts) parts *= 2;
            if (parts == 1) {
                for (int g = warp * R; g < (int)s.rows; g += STREAM_WARPS * R) {
                    float acc[R][NT];
                    Dots::template run<T, NT, R>(rows + (u64)g * row_bytes, row_bytes, min(R, (int)s.rows - g), k,
                                                 x, n_tok, 0, 1, acc);
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int t = 0; t < NT; t++)
                            if (g + r < (int)s.rows && t < n_tok) visit(tile * tile_rows + g + r, t, acc[r][t]);
                }
                return;
            }
            // Warps w .. w + parts - 1 share group w / parts; the first adds
            // the shares in order (deterministic).
            const int g = (warp / parts) * R, part = warp % parts;
            if (g < (int)s.rows) {
                float acc[R][NT];
                Dots::template run<T, NT, R>(rows + (u64)g * row_bytes, row_bytes, min(R, (int)s.rows - g), k, x,
                                             n_tok, part, parts, acc);
                if ((threadIdx.x & 31) == 0)
#pragma unroll
                    for (int r = 0; r < R; r++)
#pragma unroll
                        for (int t = 0; t < NT; t++) part_acc[warp][r][t] = acc[r][t];
            }
            __syncthreads();
            if (part == 0 && g < (int)s.rows) {
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        float sum = part_acc[warp][r][t];
                        for (int p = 1; p < parts; p++) sum += part_acc[warp + p][r][t];
                        if (g + r < (int)s.rows && t < n_tok) visit(tile * tile_rows + g + r, t, sum);
                    }
            }
        };
        if constexpr (staged) {
            const int next = tile + gridDim.x;
            if (next < n_tiles) {
                stage_tile(stages + ((i + 1) & 1) * stage_bytes, tile_span(w, row_bytes, n_rows, tile_rows, next),
                           row_bytes, end);
                cp_async_wait<1>();  // this tile's copies are done, the next one's may fly
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();  // every thread's copies of this tile are visible
            dots(stages + (i & 1) * stage_bytes + s.offset);
        } else {
            dots(s.first);
        }
        __syncthreads();  // the stage (and part_acc) is read before the next tile overwrites it
    }
}

// out[r] = dot(W[row0 + r], x) for r < n_rows.
template <class T, int R, class Dots = F32Dots>
__device__ __forceinline__ void stream_matvec(const u8* __restrict__ w, u64 row_bytes, const u8* end, int row0,
                                              int n_rows, int k, int tile_rows, u32 stage_bytes, int max_parts,
                                              const float* __restrict__ x, float* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    stream_rows<T, 1, R, Dots>(w + (u64)row0 * row_bytes, row_bytes, end, n_rows, k, tile_rows, stage_bytes,
                               max_parts, x, 1,
                         [&](int row, int, float dot) {
                             if (lane == 0) out[row] = dot;
                         });
}

// Most x rows any head launch may take (the host uses up to 4:
// STREAM_HEAD_TOKENS in stream.rs); cell[HEAD_MAX_TOKENS] counts finished
// CTAs (HEAD_CELLS).
constexpr int HEAD_MAX_TOKENS = 8;

// ids[slot + t] = the row of the largest dot(W[r], x[t]) (lowest row on
// ties), or u32::MAX when any of x[t]'s dots is not finite, for t < n_tok.
// Each CTA folds its best keys into cell[t] (atomicMax of argmax_key:
// order-free, so deterministic); the last CTA to finish (counted in
// cell[HEAD_MAX_TOKENS]) writes the ids and zeroes the cells for the next
// launch.
template <class T, int NT, int R, class Dots = F32Dots>
__device__ __forceinline__ void stream_argmax(const u8* __restrict__ w, u64 row_bytes, const u8* end, int n_rows,
                                              int k, int tile_rows, u32 stage_bytes, int max_parts,
                                              const float* __restrict__ x, int n_tok, u64* cell, u32* ids,
                                              int slot) {
    u64 best[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) best[t] = 0;
    stream_rows<T, NT, R, Dots>(w, row_bytes, end, n_rows, k, tile_rows, stage_bytes, max_parts, x, n_tok,
                          [&](int row, int t, float dot) { best[t] = max_u64(best[t], argmax_key(dot, (u32)row)); });
    __shared__ u64 warp_best[STREAM_WARPS][NT];
    if ((threadIdx.x & 31) == 0)
#pragma unroll
        for (int t = 0; t < NT; t++) warp_best[threadIdx.x >> 5][t] = best[t];
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int t = 0; t < n_tok; t++) {
        u64 b = warp_best[0][t];
#pragma unroll
        for (int i = 1; i < STREAM_WARPS; i++) b = max_u64(b, warp_best[i][t]);
        atomicMax(&cell[t], b);
    }
    __threadfence();  // the maxima land before this CTA counts as done
    if (atomicAdd(&cell[HEAD_MAX_TOKENS], 1ull) != gridDim.x - 1) return;
    __threadfence();
    for (int t = 0; t < n_tok; t++) {
        const u64 b = atomicExch(&cell[t], 0ull);
        ids[slot + t] = (b == ARGMAX_BAD || b == 0) ? 0xffffffffu : ~(u32)b;
    }
    cell[HEAD_MAX_TOKENS] = 0;
}

// ---- entry points -------------------------------------------------------------

// R = rows per warp group: 4 where tiles are tall enough, fewer for short
// tiles (so every warp has rows); the host picks (STREAM_R in stream.rs).
#define KILN_STREAM(R)                                                                                           \
    extern "C" __global__ void __launch_bounds__(STREAM_WARPS * 32)                                               \
        KILN_CAT(KILN_CAT(stream_matvec, KILN_WEIGHT), r##R)(const u8* w, u64 row_bytes, const u8* end, int row0, \
                                                            int n_rows, int k, int tile_rows, u32 stage_bytes,     \
                                                            int max_parts, const float* x, float* out) {          \
        stream_matvec<KILN_WEIGHT, R>(w, row_bytes, end, row0, n_rows, k, tile_rows, stage_bytes, max_parts, x,    \
                                      out);                                                                       \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(STREAM_WARPS * 32)                                               \
        KILN_CAT(KILN_CAT(stream_argmax, KILN_WEIGHT), r##R)(const u8* w, u64 row_bytes, const u8* end,           \
                                                            int n_rows, int k, int tile_rows, u32 stage_bytes,     \
                                                            int max_parts, const float* x, int n_tok, u64* cell,  \
                                                            u32* ids, int slot) {                                 \
        stream_argmax<KILN_WEIGHT, 1, R>(w, row_bytes, end, n_rows, k, tile_rows, stage_bytes, max_parts, x,      \
                                         n_tok, cell, ids, slot);                                                 \
    }

KILN_STREAM(1)
KILN_STREAM(2)
KILN_STREAM(4)

// The head of 2 .. NT x rows (one row per warp: NT x units in registers).
#define KILN_STREAM_HEAD(NT)                                                                                      \
    extern "C" __global__ void __launch_bounds__(STREAM_WARPS * 32)                                               \
        KILN_CAT(KILN_CAT(stream_argmax, KILN_WEIGHT), t##NT)(const u8* w, u64 row_bytes, const u8* end,          \
                                                             int n_rows, int k, int tile_rows, u32 stage_bytes,    \
                                                             int max_parts, const float* x, int n_tok, u64* cell, \
                                                             u32* ids, int slot) {                                \
        stream_argmax<KILN_WEIGHT, NT, 1>(w, row_bytes, end, n_rows, k, tile_rows, stage_bytes, max_parts, x,     \
                                          n_tok, cell, ids, slot);                                                \
    }

KILN_STREAM_HEAD(2)
KILN_STREAM_HEAD(4)
