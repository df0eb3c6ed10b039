// mma2.cu: the tensor-core GEMM of batched decode with x split once per
// product (KILN_CUDA_MMA=2, mma.rs; appended after mma.cu, whose helpers
// and exactness argument it shares).
//
//   mma2_split_x  x [n_tok, k] f32 -> three bfloat16 planes (hi, mid, lo:
//                 mma.cu's split) and sum(x) per group of G columns,
//                 rows padded to a whole token tile and columns to a
//                 whole k step with zeros, so the GEMM has no bounds on x.
//   mma2_gemm     mma_gemm's product from the split x: each k step's planes
//                 and sums arrive in shared memory by cp.async (no
//                 registers, no arithmetic), the weight tile is decoded
//                 from registers as in mma_gemm into a second buffer, so
//                 one barrier per step; d and m are applied once per group
//                 of columns under one scale (MmaGroup: 32 for the Q4_K
//                 family, half the f32 work of mma_gemm's 16).
//
// Against mma_gemm at 64 tokens (Q4_K, sm_90 SASS): the x split and its
// stores leave every CTA of the product (~250 instructions of ~1,300 per
// thread and k step), the group fixups halve the FFMAs (256 -> 128), and
// the x prefetch no longer holds 32 registers.

// Layout of the split x (mma.rs sizes it): planes [3][rows][kp / 2] words
// (pairs, the lower column in the low half), then sums [rows][kp / G]
// floats, kp = k rounded up to MMA_K, rows = n_tok rounded up to a tile.
//
// How x is split (the planes policy P of a kernel):
//   Bf16Planes  (mma2_*) three bfloat16 planes, each the rounding of what
//               the ones before left: 24 bits of every value (mma.cu).
//   HalfPlanes  (mma2h_*, KILN_CUDA_MMA=3) two IEEE half planes of x
//               times 2^-e, e per token such that its largest |x| scales
//               into [2^14, 2^15): 22 significant bits of every value down
//               to 2^-29 of that largest one (smaller ones within 2^-40 of
//               it), with two MMAs per fragment instead of three and two
//               thirds of the x tile's bytes. The codes (at most 8 bits)
//               are exact in half as in bfloat16. The sums are of the
//               scaled x too, so the whole dot comes out times 2^-e and is
//               multiplied back by 2^e once, at the store (a power of two:
//               exact; the greedy head compares the scaled dots, the same
//               order). The third plane's place in the workspace holds the
//               2^e (a float per token row). Quantized weights only: BF16
//               weights are not exact in half, so their mma2h_ kernels keep
//               Bf16Planes.
struct Bf16Planes {
    static constexpr int PLANES = 3;
    static constexpr bool SCALED = false;
    static __device__ __forceinline__ u32 pack(float lo, float hi) { return pack_bf16(lo, hi); }
    static __device__ __forceinline__ float low(u32 w) { return bf16_lo(w); }
    static __device__ __forceinline__ float high(u32 w) { return bf16_hi(w); }
    static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
        mma_bf16(c, a, b);
    }
};

struct HalfPlanes {
    static constexpr int PLANES = 2;
    static constexpr bool SCALED = true;
    // {half(lo), half(hi)}, each rounded to nearest.
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r = 0;
#if __CUDA_ARCH__ >= 800
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
#endif
        return r;
    }
    static __device__ __forceinline__ float low(u32 w) { return f16_to_f32(w & 0xFFFF); }
    static __device__ __forceinline__ float high(u32 w) { return f16_to_f32(w >> 16); }
    // mma_bf16's tile with half operands.
    static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], const u32 (&b)[2]) {
#if __CUDA_ARCH__ >= 800
        KILN_MMA_16816("f16");
#endif
    }
    // A unit's eight codes (bytes, minus `bias`) as four pairs: PRMT puts
    // each byte b in the low mantissa of half 1024 (0x6400: ulp 1 up to
    // 2048, so the half is 1024 + b exactly), one half2 subtraction of 1024
    // + bias leaves b - bias, exact (an integer of at most 8 bits): two
    // instructions a pair, where floats and a conversion took five.
    static __device__ __forceinline__ uint4 codes(uint2 raw, float bias) {
        const u32 off = (0x6400u | (u32)bias) * 0x10001u;
        u32 w[4] = {__byte_perm(raw.x, 0x64646464u, 0x4140), __byte_perm(raw.x, 0x64646464u, 0x4342),
                    __byte_perm(raw.y, 0x64646464u, 0x4140), __byte_perm(raw.y, 0x64646464u, 0x4342)};
#pragma unroll
        for (int i = 0; i < 4; i++) asm("sub.f16x2 %0, %0, %1;" : "+r"(w[i]) : "r"(off));
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
};

template <bool C, class A, class B>
struct Pick {
    using type = A;
};
template <class A, class B>
struct Pick<false, A, B> {
    using type = B;
};

// The planes of type T's mma2 (HALF: mma2h) kernels.
template <class T, bool HALF>
using Mma2Planes = typename Pick<HALF && (T::QK >= 32), HalfPlanes, Bf16Planes>::type;

// The planes and sums of one 8-value unit v of the padded x at token row
// t, column c (threads of a group in consecutive lanes, all of the warp
// present: the sums are added across the group's G / 8 lanes).
template <class P>
__device__ __forceinline__ void mma2_split_unit(float (&v)[8], bool store, int t, int c, int rows, int kp, int group,
                                                u32* planes, float* sums) {
    float s = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    for (int o = 1; o < (group >> 3); o <<= 1) s += __shfl_xor_sync(FULL_MASK, s, o);
    if (!store) return;
    if ((c % group) == 0) sums[(size_t)t * (kp / group) + c / group] = s;
#pragma unroll
    for (int plane = 0; plane < P::PLANES; plane++) {
        u32 wd[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            wd[j] = P::pack(v[2 * j], v[2 * j + 1]);
            v[2 * j] -= P::low(wd[j]), v[2 * j + 1] -= P::high(wd[j]);
        }
        *(uint4*)(planes + ((size_t)plane * rows + t) * (kp >> 1) + (c >> 1)) = make_uint4(wd[0], wd[1], wd[2], wd[3]);
    }
}

// Unit c / 8 of x's row t (zeros past n_tok and k).
__device__ __forceinline__ void mma2_x_unit(const float* x, int n_tok, int k, int t, int c, bool in, float (&v)[8]) {
    in = in && t < n_tok && c < k;
    const float4* p = (const float4*)(x + (size_t)min(t, n_tok - 1) * k + min(c, k - 8));
    const float4 a = in ? p[0] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    const float4 b = in ? p[1] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// Bf16Planes: one thread per 8-value unit of the padded [rows, kp] x.
// HalfPlanes: one warp per token row, which first finds the row's largest
// |x| (fmaxf drops a NaN, which the planes keep; an infinite value makes
// the scale NaN, so the row's outputs are NaN either way), then splits
// x 2^-e unit by unit.
template <class P>
__device__ __forceinline__ void mma2_split(const float* x, int n_tok, int k, int rows, int kp, int group, u32* planes,
                                           float* sums) {
    KERNEL_PROLOGUE();
    const int units = kp >> 3;
    if constexpr (!P::SCALED) {
        const int n = rows * units;
        // Whole warps take whole groups: n is a multiple of 8 (units of
        // a padded row), so no lane of a group exits early.
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n + 31; i += gridDim.x * blockDim.x) {
            if (i - (int)(threadIdx.x & 31) >= n) break;  // the whole warp is past the end
            const int t = i / units, c = 8 * (i % units);
            float v[8];
            mma2_x_unit(x, n_tok, k, t, c, i < n, v);
            mma2_split_unit<P>(v, i < n, t, c, rows, kp, group, planes, sums);
        }
    } else {
        float* scales = (float*)(planes + (size_t)2 * rows * (kp >> 1));
        const int lane = threadIdx.x & 31, warps = gridDim.x * (blockDim.x >> 5);
        for (int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < rows; t += warps) {
            float amax = 0.0f;
            for (int u = lane; u < units; u += 32) {
                float v[8];
                mma2_x_unit(x, n_tok, k, t, 8 * u, true, v);
#pragma unroll
                for (int j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
            int e = 15;
            float scale = 1.0f;
            if (!isfinite(amax)) {
                scale = __int_as_float(0x7fc00000);
            } else if (amax > 0.0f) {
                frexpf(amax, &e);  // amax in [2^(e-1), 2^e)
                scale = ldexpf(1.0f, e - 15);
            }
            if (lane == 0) scales[t] = scale;
            // units is a multiple of 8, so every pass of 32 lanes holds
            // whole groups (a pass past the end stores nothing).
            for (int u0 = 0; u0 < units; u0 += 32) {
                const int u = u0 + lane;
                float v[8];
                mma2_x_unit(x, n_tok, k, t, 8 * u, u < units, v);
#pragma unroll
                for (int j = 0; j < 8; j++) v[j] = ldexpf(v[j], 15 - e);
                mma2_split_unit<P>(v, u < units, t, 8 * u, rows, kp, group, planes, sums);
            }
        }
    }
}

KILN_ENTRY(mma2_split_x, WARPS * 32)(const float* x, int n_tok, int k, int rows, int kp, int group, u32* planes,
                                      float* sums) {
    mma2_split<Mma2Planes<KILN_WEIGHT, false>>(x, n_tok, k, rows, kp, group, planes, sums);
}
KILN_ENTRY(mma2h_split_x, WARPS * 32)(const float* x, int n_tok, int k, int rows, int kp, int group, u32* planes,
                                       float* sums) {
    mma2_split<Mma2Planes<KILN_WEIGHT, true>>(x, n_tok, k, rows, kp, group, planes, sums);
}

// Shared memory of an mma2 CTA, in words: two weight buffers (codes, then
// (d, m) per row and group), then two x buffers (planes, then sums per
// token and group): 2 W_BUF + 2 X_BUF words, as mma.rs's mma2_smem_bytes
// reserves them for P's planes (x_planes there: two half, or three).
template <class T, class P, int WM, int WN, int N8>
struct Mma2Shape {
    using S = MmaShape<WM, WN, N8>;
    static constexpr int GROUPS = MMA_K / MmaGroup<T>::COLS;
    static constexpr int W_BUF = S::ROWS * MMA_STRIDE + S::ROWS * GROUPS * 2;
    static constexpr int X_SUMS = P::PLANES * S::TOKENS * MMA_STRIDE;
    static constexpr int X_BUF = X_SUMS + S::TOKENS * GROUPS;
    static_assert(X_BUF <= MMA_PLANES * S::TOKENS * MMA_STRIDE + S::TOKENS * GROUPS, "within mma2_smem_bytes");
};

// The shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }

// cp.async of 16 bytes to a shared-memory address (smem_addr).
__device__ __forceinline__ void cp_async16_shared(u32 dst, const void* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#endif
}

// Copies GROUPS floats per token of the tile's tokens (16 bytes for 4
// groups, 8 for 2: the group sums of x) from `src` (rows of kp / G
// floats) to `dst` (GROUPS a token), by cp.async.
template <class T, class S, int GROUPS>
__device__ __forceinline__ void mma2_copy_groups(const float* src, int kp, int tok0, int u0, float* dst) {
    static_assert(S::TOKENS <= S::THREADS, "a token a thread");
    const int t = threadIdx.x;
    if (t < S::TOKENS) {
        const float* from = src + (size_t)(tok0 + t) * (kp / MmaGroup<T>::COLS) + u0 * 8 / MmaGroup<T>::COLS;
        u64 s, g = (u64)from;
        asm("cvta.to.shared.u64 %0, %1;" : "=l"(s) : "l"(dst + t * GROUPS));
        if (GROUPS == 4)
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)s), "l"(g) : "memory");
        else
            asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((u32)s), "l"(g) : "memory");
    }
}

// Issues this thread's cp.async copies of k step u0's x tile (planes and
// sums) into the buffer at `xb`, one commit.
template <class T, class P, class S, class S2>
__device__ __forceinline__ void mma2_copy_x(const u32* planes, const float* sums, int rows, int kp, int tok0, int u0,
                                            u32* xb) {
    // Planes: 8 16-byte pieces per (plane, token) row of the step; thread
    // i takes piece i % 8 of rows i / 8 + RP j (RP rows a pass, dividing
    // the tile's tokens: pass j is plane j / JT, tokens RP (j % JT) ..).
    constexpr int RP = S::THREADS / 8, JT = S::TOKENS / RP;
    static_assert(S::TOKENS % RP == 0, "passes of whole plane rows");
    const int r0 = threadIdx.x >> 3, piece = threadIdx.x & 7;
    const size_t row_words = kp >> 1;
    const u32* src = planes + (tok0 + r0) * row_words + 4 * u0 + 4 * piece;
    // Shared addresses as 32-bit values: constant offsets fold into them.
    const u32 dst = smem_addr(xb + r0 * MMA_STRIDE + 4 * piece);
#pragma unroll
    for (int j = 0; j < P::PLANES * JT; j++)
        cp_async16_shared(dst + 4 * RP * j * MMA_STRIDE,
                          src + (size_t)(j / JT) * rows * row_words + (size_t)(RP * (j % JT)) * row_words);
    mma2_copy_groups<T, S, S2::GROUPS>(sums, kp, tok0, u0, (float*)(xb + S2::X_SUMS));
    cp_async_commit();
}

// Weight staging: the next k step's units decoded into registers between
// steps (codes as the planes' 16-bit pairs, exact; their affines) and
// stored to shared memory at the top of the step. A row past n_rows
// reads the last one (its outputs are never stored); units past u_end
// read the last unit and meet zero x, so a finite code adds 0, and a
// group wholly past the end d * 0 + m * 0. Two thread maps, each the
// faster where it runs (H200, 2026-12-06, bench/RESULTS.md):
//   half planes (64- and 128-token tiles: batched decode and prefill):
//     thread i takes row i / 2 and units 4 (i % 2) .. +4, one group of 32
//     columns or two of 16, so a group's scale is decoded once, not once
//     per unit, the codes turn to half by PRMT + HSUB2, and the four
//     units are one 64-byte run in shared memory (a third fewer
//     instructions a k step; pp512 1B +2.4%, 4B +0.8%, 64 rows
//     unchanged: that step waits on its loads, not on issue);
//   bfloat16 planes (16- and 32-token tiles): eight consecutive threads
//     take one row's eight units, W_PASSES rows apart (coalesced loads:
//     the pair map lost 15-27% at 16 rows, where each of its load
//     instructions touched 16 rows x 2 places).
template <class T, class P, class S>
struct Mma2Weights {
    static constexpr bool PAIRS = P::SCALED;
    static_assert(!PAIRS || (S::THREADS == 2 * S::ROWS && S::W_PASSES == 4 && T::QK >= 32), "two threads a row");
    static constexpr int G = MmaGroup<T>::COLS;
    const u8* row[PAIRS ? 1 : S::W_PASSES];
    uint4 q[S::W_PASSES];
    Affine a[PAIRS ? 2 : S::W_PASSES];

    __device__ __forceinline__ Mma2Weights(const u8* w, u64 row_bytes, int n_rows) {
        if constexpr (PAIRS) {
            row[0] = w + (u64)min((int)(threadIdx.x >> 1), n_rows - 1) * row_bytes;
        } else {
#pragma unroll
            for (int p = 0; p < S::W_PASSES; p++)
                row[p] = w + (u64)min((int)(threadIdx.x + p * S::THREADS) / MMA_K_UNITS, n_rows - 1) * row_bytes;
        }
    }

    // Loads this thread's units of k step u0 into registers.
    __device__ __forceinline__ void load(int u0, int u_end) {
        if constexpr (PAIRS) {
            // Blocks hold whole groups of four units and u_end is a
            // multiple of four (k of QK), so the four units lie in one
            // block; a group wholly past the end reads the last one.
            const u32 u = min((u32)(u0 + 4 * (threadIdx.x & 1)), (u32)(u_end - 4));
            const int j = u % (T::QK / 8);
            const u8* b = row[0] + (size_t)(u / (T::QK / 8)) * T::BYTES;
#pragma unroll
            for (int p = 0; p < 4; p++) {
                q[p] = P::codes(T::raw(b, j + p), T::BIAS);
                if (p == 0 || (G == 16 && p == 2)) a[p >> 1] = T::affine(b, j + p);
            }
        } else {
            const int u = min(u0 + (int)(threadIdx.x % MMA_K_UNITS), u_end - 1);
#pragma unroll
            for (int p = 0; p < S::W_PASSES; p++) {
                Unit un;
                load_unit<T>(row[p], u, un);
                q[p] = make_uint4(P::pack(un.q[0], un.q[1]), P::pack(un.q[2], un.q[3]), P::pack(un.q[4], un.q[5]),
                                  P::pack(un.q[6], un.q[7]));
                a[p] = un.a;
            }
        }
    }

    // Writes the staged step into shared memory (mma_store_unit's layout):
    // codes, and the (d, m) of each group of G columns.
    __device__ __forceinline__ void store(u32* ws, float2* wa) const {
        if constexpr (PAIRS) {
            const int r = threadIdx.x >> 1, h = threadIdx.x & 1;
            uint4* codes = (uint4*)(ws + r * MMA_STRIDE + 16 * h);
#pragma unroll
            for (int p = 0; p < 4; p++) codes[p] = q[p];
            if constexpr (G == 32) {
                wa[r * 2 + h] = make_float2(a[0].d, a[0].m);
            } else {
                wa[r * 4 + 2 * h] = make_float2(a[0].d, a[0].m);
                wa[r * 4 + 2 * h + 1] = make_float2(a[1].d, a[1].m);
            }
        } else {
#pragma unroll
            for (int p = 0; p < S::W_PASSES; p++) mma_store_unit<S, G>(p, q[p], a[p], ws, wa);
        }
    }
};

// Four (or two) 8 x 8 bfloat16 matrices from shared memory into MMA
// fragment registers: lane l gives the address of row l % 8 of matrix
// l / 8, and register i receives row (lane / 4), words (lane % 4) of
// matrix i, the layout of an mma.sync operand.
// `a` is a shared-memory address (smem_addr).
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}
__device__ __forceinline__ void ldsm_x2(u32 (&r)[2], u32 a) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
}

// acc += this warp's block of a step: per group of columns under one
// (d, m), the planes' products of its chunks into a fresh f32 tile
// (small planes first), then acc += d * tile (+ m * sum(x)). Fragments
// by ldmatrix: A of rows 16 mi .. as matrices (rows 0-7, 8-15) x (words
// 0-3, 4-7); B of tokens 8 ni .. as (planes 2, 1) x (words 0-3, 4-7), then
// plane 0's two (three planes), or as (planes 1, 0) x (words 0-3, 4-7)
// (two).
template <class T, class P, int N8, int GROUPS>
__device__ __forceinline__ void mma2_step(const u32* ws, const float2* wa, const u32* xs, int plane_words,
                                          const float* xsum, float (&acc)[2][N8][4]) {
    constexpr int CPG = MmaGroup<T>::COLS / 16;
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, m = lane >> 3, r8 = lane & 7;
    // Byte addresses; the loops below add compile-time offsets.
    const u32 a_lane = smem_addr(ws + (r8 + 8 * (m & 1)) * MMA_STRIDE + 4 * (m >> 1));
    const u32 b_lane = smem_addr(xs + (P::PLANES - 1 - (m >> 1)) * plane_words + r8 * MMA_STRIDE + 4 * (m & 1));
#pragma unroll
    for (int grp = 0; grp < GROUPS; grp++) {
        u32 a[CPG][2][4];
        float2 aff[2][2];
#pragma unroll
        for (int cc = 0; cc < CPG; cc++)
#pragma unroll
            for (int mi = 0; mi < 2; mi++) ldsm_x4(a[cc][mi], a_lane + 4 * (16 * mi * MMA_STRIDE + 8 * (grp * CPG + cc)));
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            aff[mi][0] = wa[(16 * mi + g) * GROUPS + grp];
            aff[mi][1] = wa[(16 * mi + g + 8) * GROUPS + grp];
        }
#pragma unroll
        for (int ni = 0; ni < N8; ni++) {
            float part[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
            for (int cc = 0; cc < CPG; cc++) {
                const u32 off = 4 * (8 * ni * MMA_STRIDE + 8 * (grp * CPG + cc));
                // The two smallest planes (P - 1, P - 2), then plane 0.
                u32 bq[4];
                ldsm_x4(bq, b_lane + off);
                const u32 b_last[2] = {bq[0], bq[1]}, b_next[2] = {bq[2], bq[3]};
                P::mma(part[0], a[cc][0], b_last);
                P::mma(part[1], a[cc][1], b_last);
                P::mma(part[0], a[cc][0], b_next);
                P::mma(part[1], a[cc][1], b_next);
                if constexpr (P::PLANES == 3) {
                    u32 b0[2];
                    ldsm_x2(b0, smem_addr(xs + r8 * MMA_STRIDE + 4 * (m & 1)) + off);
                    P::mma(part[0], a[cc][0], b0);
                    P::mma(part[1], a[cc][1], b0);
                }
            }
            mma_apply<T, N8>(acc, ni, part, aff, xsum + (8 * ni + 2 * t) * GROUPS + grp, GROUPS);
        }
    }
}

// acc = this warp's block of a weight tile (its rows in `wt`) times the
// split x tile of tokens tok0 .., over units u_begin .. u_end. The caller
// has loaded the first step's weights into wt (before waiting on the
// kernel that split x: weights are constants).
template <class T, class P, int WM, int WN, int N8>
__device__ __forceinline__ void mma2_tile(Mma2Weights<T, P, MmaShape<WM, WN, N8>>& wt, const u32* __restrict__ planes,
                                          const float* __restrict__ sums, int rows, int kp, int tok0, int u_begin,
                                          int u_end, float (&acc)[2][N8][4]) {
    using S = MmaShape<WM, WN, N8>;
    using S2 = Mma2Shape<T, P, WM, WN, N8>;
    constexpr int GROUPS = S2::GROUPS;
    extern __shared__ __align__(16) u32 mma_smem[];
    u32* wbuf = mma_smem;
    u32* xbuf = mma_smem + 2 * S2::W_BUF;
    const int warp = threadIdx.x >> 5, wm = warp % WM, wn = warp / WM;
    __syncthreads();  // a previous tile's last step has read the buffers
    mma2_copy_x<T, P, S, S2>(planes, sums, rows, kp, tok0, u_begin, xbuf);
    zero_acc(acc);
    for (int u0 = u_begin, i = 0; u0 < u_end; u0 += MMA_K_UNITS, i++) {
        u32* ws = wbuf + (i & 1) * S2::W_BUF;
        u32* xs = xbuf + (i & 1) * S2::X_BUF;
        // Buffer i & 1 was last read in step i - 2, before every thread
        // passed the previous step's barrier.
        wt.store(ws, (float2*)(ws + S::ROWS * MMA_STRIDE));
        cp_async_wait<0>();
        __syncthreads();  // step i's tiles are in place; step i - 1's buffers are free
        if (u0 + MMA_K_UNITS < u_end) {
            mma2_copy_x<T, P, S, S2>(planes, sums, rows, kp, tok0, u0 + MMA_K_UNITS,
                                     xbuf + ((i + 1) & 1) * S2::X_BUF);
            wt.load(u0 + MMA_K_UNITS, u_end);
        }
        mma2_step<T, P, N8, GROUPS>(ws + 32 * wm * MMA_STRIDE,
                                    (const float2*)(ws + S::ROWS * MMA_STRIDE) + 32 * wm * GROUPS,
                                    xs + 8 * N8 * wn * MMA_STRIDE, S::TOKENS * MMA_STRIDE,
                                    (const float*)(xs + S2::X_SUMS) + 8 * N8 * wn * GROUPS, acc);
    }
}

// Where the split x of n_tok rows of k values lies for a tile of TOKENS
// (mma2_split_x, launched for the same shape): padded rows and columns,
// the sums after the planes.
struct Mma2X {
    int rows, kp;
    const float* sums;
    const float* scales;  // HalfPlanes: 2^e per token row
    template <int TOKENS>
    __device__ __forceinline__ static Mma2X at(const u32* planes, int n_tok, int k) {
        Mma2X l;
        l.kp = (k + MMA_K - 1) / MMA_K * MMA_K;
        l.rows = (n_tok + TOKENS - 1) / TOKENS * TOKENS;
        l.sums = (const float*)(planes + (size_t)3 * l.rows * (l.kp >> 1));
        l.scales = (const float*)(planes + (size_t)2 * l.rows * (l.kp >> 1));
        return l;
    }
};

// HalfPlanes: acc (of the tile's tokens from `scales`, warp column wn)
// times each token's 2^e.
template <int N8>
__device__ __forceinline__ void mma2_unscale(float (&acc)[2][N8][4], const float* scales, int wn) {
    const int t = threadIdx.x & 3;
#pragma unroll
    for (int ni = 0; ni < N8; ni++) {
        const int tt = 8 * N8 * wn + 8 * ni + 2 * t;
        const float sc[2] = {scales[tt], scales[tt + 1]};
#pragma unroll
        for (int mi = 0; mi < 2; mi++)
#pragma unroll
            for (int c = 0; c < 4; c++) acc[mi][ni][c] *= sc[c & 1];
    }
}

// CTA (x, y, z): weight rows S::ROWS x .., tokens S::TOKENS z .., units
// y * units_per_split .. (a multiple of MMA_K_UNITS), as mma_gemm (same
// arguments, outputs and split partials), but from the split x that
// mma2_split_x (HALF: mma2h_split_x) wrote at `planes` for this shape's
// token tile.
template <class T, bool HALF, int WM, int WN, int N8>
__device__ __forceinline__ void mma2_gemm(const u8* __restrict__ w, u64 row_bytes, int row0, int n_rows, int k,
                                          const u32* __restrict__ planes, int n_tok, int units_per_split,
                                          float* __restrict__ out) {
#if __CUDA_ARCH__ >= 800
    if constexpr (CodesFitBf16<T>::value) {
        using S = MmaShape<WM, WN, N8>;
        const int tile = blockIdx.x * S::ROWS, tok0 = blockIdx.z * S::TOKENS;
        const int u_begin = blockIdx.y * units_per_split, u_end = min(k >> 3, u_begin + units_per_split);
        const int w_rows = n_rows - tile;
        const Mma2X xl = Mma2X::at<S::TOKENS>(planes, n_tok, k);
        using P = Mma2Planes<T, HALF>;
        Mma2Weights<T, P, S> wt(w + (u64)(row0 + tile) * row_bytes, row_bytes, w_rows);
        wt.load(u_begin, u_end);
        KERNEL_PROLOGUE();
        float acc[2][N8][4];
        mma2_tile<T, P, WM, WN, N8>(wt, planes, xl.sums, xl.rows, xl.kp, tok0, u_begin, u_end, acc);
        const int warp = threadIdx.x >> 5;
        if constexpr (P::SCALED) mma2_unscale(acc, xl.scales + tok0, warp / WM);
        mma_write(acc, out + (size_t)blockIdx.y * n_tok * n_rows, n_rows, tile, w_rows, tok0,
                  min(S::TOKENS, n_tok - tok0), warp % WM, warp / WM);
    }
#endif
}

// mma_argmax from the split x: CTA (x, 0, z) takes row tiles x, x +
// gridDim.x, ... whole and writes each token's best key to
// partials[(tok0 + t) * gridDim.x + x].
template <class T, bool HALF, int WM, int WN, int N8>
__device__ __forceinline__ void mma2_argmax(const u8* __restrict__ w, u64 row_bytes, int n_rows, int k,
                                            const u32* __restrict__ planes, int n_tok, u64* __restrict__ partials) {
#if __CUDA_ARCH__ >= 800
    if constexpr (CodesFitBf16<T>::value) {
        using S = MmaShape<WM, WN, N8>;
        __shared__ u64 best[S::TOKENS];
        const int tok0 = blockIdx.z * S::TOKENS, nt = min(S::TOKENS, n_tok - tok0);
        const Mma2X xl = Mma2X::at<S::TOKENS>(planes, n_tok, k);
        for (int t = threadIdx.x; t < S::TOKENS; t += S::THREADS) best[t] = 0;  // visible after mma2_tile's barrier
        KERNEL_PROLOGUE();
        const int warp = threadIdx.x >> 5;
        for (int tile = blockIdx.x * S::ROWS; tile < n_rows; tile += gridDim.x * S::ROWS) {
            using P = Mma2Planes<T, HALF>;
            Mma2Weights<T, P, S> wt(w + (u64)tile * row_bytes, row_bytes, n_rows - tile);
            wt.load(0, k >> 3);
            float acc[2][N8][4];
            mma2_tile<T, P, WM, WN, N8>(wt, planes, xl.sums, xl.rows, xl.kp, tok0, 0, k >> 3, acc);
            mma_fold_best(acc, tile, n_rows, nt, warp % WM, warp / WM, best);
        }
        __syncthreads();
        for (int tt = threadIdx.x; tt < nt; tt += S::THREADS)
            partials[(size_t)(tok0 + tt) * gridDim.x + blockIdx.x] = best[tt];
    }
#endif
}

#define KILN_MMA2_FORM(OP, HALF, WM, WN, N8, NAME)                                                               \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN)                                                    \
        KILN_CAT(KILN_CAT(OP##_gemm, KILN_WEIGHT), NAME)(const u8* w, u64 row_bytes, int row0, int n_rows, int k, \
                                                        const u32* planes, int n_tok, int units_per_split,         \
                                                        float* out) {                                             \
        mma2_gemm<KILN_WEIGHT, HALF, WM, WN, N8>(w, row_bytes, row0, n_rows, k, planes, n_tok, units_per_split,   \
                                                 out);                                                            \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN)                                                    \
        KILN_CAT(KILN_CAT(OP##_argmax, KILN_WEIGHT), NAME)(const u8* w, u64 row_bytes, int n_rows, int k,        \
                                                          const u32* planes, int n_tok, u64* partials) {         \
        mma2_argmax<KILN_WEIGHT, HALF, WM, WN, N8>(w, row_bytes, n_rows, k, planes, n_tok, partials);             \
    }

// Both forms of a shape: mma2_ (bfloat16 planes) and mma2h_ (half).
#define KILN_MMA2(WM, WN, N8, NAME)                \
    KILN_MMA2_FORM(mma2, false, WM, WN, N8, NAME) \
    KILN_MMA2_FORM(mma2h, true, WM, WN, N8, NAME)

// The shapes of mma.cu's KILN_MMA (MMA_SHAPES in mma.rs).
KILN_MMA2(2, 2, 1, m64n16)
KILN_MMA2(2, 2, 2, m64n32)
KILN_MMA2(2, 2, 4, m64n64)
KILN_MMA2(4, 2, 4, m128n64)
KILN_MMA2(4, 2, 8, m128n128)
