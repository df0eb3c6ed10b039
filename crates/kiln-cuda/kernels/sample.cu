// The sampling head (kiln_model::sample, whose sample_row is the scalar
// twin): one CTA of SAMPLE_THREADS per head row j, over logits row j
// (softcapped already). The row's sampler state is a buffer of u32 words
// whose address is entry j of the step's sampler table (0: no sampler, the
// argmax). In order: logit_bias, penalties over the state's ring, a
// NaN/+inf check (then id 0xffffffff), greedy or temperature -> top-k ->
// top-p -> min-p -> one draw from the state's xoshiro256** stream, the
// requested logprobs; then the state advances in place (ring, stream,
// count) and the id lands in ids[id0 + j]. Only f32 roundings the twin
// makes are made here (explicit _rn ops: --fmad=true would fuse them).

#define SAMPLE_THREADS 1024
#define TOPK_MAX 256
#define LOGPROBS_MAX 20
// State words (kiln_model::sample).
#define S_TEMP 0
#define S_TOPK 1
#define S_TOPP 2
#define S_MINP 3
#define S_REP 4
#define S_PRES 5
#define S_FREQ 6
#define S_LAST_N 7
#define S_N_BIAS 8
#define S_N_LOGPROBS 9
#define S_SEEN 10
#define S_RNG 12
#define S_OUT 20
#define S_RING (S_OUT + 2 + 2 * LOGPROBS_MAX)
#define NO_ID 0xffffffffu
// order_key(-inf): keys above it are finite (NaN never reaches a key).
#define KEY_NEG_INF 0x007fffffu

// A u32 whose order is the float order.
__device__ __forceinline__ u32 order_key(float f) {
    const u32 u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ u64 rotl64(u64 x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256** (kiln_model::Rng), then its next_f64.
__device__ double rng_next_f64(u64* s) {
    const u64 r = rotl64(s[1] * 5, 7) * 9;
    const u64 t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl64(s[3], 45);
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

// Exclusive prefix sum over the block (every thread calls it), `total`
// returned through `*total`; `w` holds 32 values.
template <typename T>
__device__ T block_scan(T v, T* w, T* total) {
    const int lane = threadIdx.x % WARP, warp = threadIdx.x / WARP, n_warps = blockDim.x / WARP;
    T inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(FULL_MASK, inc, o);
        if (lane >= o) inc += y;
    }
    __syncthreads();
    if (lane == 31) w[warp] = inc;
    __syncthreads();
    if (warp == 0) {
        T x = lane < n_warps ? w[lane] : T(0);
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const T y = __shfl_up_sync(FULL_MASK, x, o);
            if (lane >= o) x += y;
        }
        w[lane] = x; // inclusive over warps
    }
    __syncthreads();
    *total = w[n_warps - 1];
    return inc - v + (warp > 0 ? w[warp - 1] : T(0));
}

__device__ float block_max(float v, float* w) {
    v = warp_max(v);
    __syncthreads();
    if (threadIdx.x % WARP == 0) w[threadIdx.x / WARP] = v;
    __syncthreads();
    const u32 lane = threadIdx.x % WARP;
    v = lane < blockDim.x / WARP ? w[lane] : -INFINITY;
    return warp_max(v);
}

// The first maximum of L[0..n) above -inf (NO_ID: none).
__device__ u32 block_argmax(const float* L, u32 n, float* wv, u32* wi) {
    float best = -INFINITY;
    u32 at = NO_ID;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x)
        if (L[i] > best) best = L[i], at = i;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float b = __shfl_xor_sync(FULL_MASK, best, o);
        const u32 a = __shfl_xor_sync(FULL_MASK, at, o);
        if (b > best || (b == best && a < at)) best = b, at = a;
    }
    __syncthreads();
    if (threadIdx.x % WARP == 0) wv[threadIdx.x / WARP] = best, wi[threadIdx.x / WARP] = at;
    __syncthreads();
    if (threadIdx.x < WARP) {
        best = threadIdx.x < blockDim.x / WARP ? wv[threadIdx.x] : -INFINITY;
        at = threadIdx.x < blockDim.x / WARP ? wi[threadIdx.x] : NO_ID;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float b = __shfl_xor_sync(FULL_MASK, best, o);
            const u32 a = __shfl_xor_sync(FULL_MASK, at, o);
            if (b > best || (b == best && a < at)) best = b, at = a;
        }
        if (threadIdx.x == 0) wi[0] = at;
    }
    __syncthreads();
    return wi[0];
}

struct Shared {
    u32 hist[256];
    u32 wu[32];
    float wf[32];
    double wd[32];
    u32 cand_id[TOPK_MAX];
    float cand_v[TOPK_MAX];
    u32 sort_id[TOPK_MAX];
    float sort_v[TOPK_MAX];
    float p[TOPK_MAX];
    u32 bcast[4];
    double bcast_d;
};

// The k largest of L[0..n) whose key is above `floor`, by (value desc, id
// asc), into cand_id/cand_v in no particular order; returns how many
// (k, or all above the floor when fewer). A radix select of the k-th key,
// then a collection whose ties at that key go to the lowest ids.
__device__ u32 select_top(const float* L, u32 n, u32 k, u32 floor, Shared& sh) {
    u32 c = 0;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) c += order_key(L[i]) > floor;
    u32 total;
    block_scan(c, sh.wu, &total);
    u32 thr = floor, need = 0;
    if (total > k) {
        u32 prefix = 0, mask = 0;
        need = k;
        for (int d = 3; d >= 0; --d) {
            for (u32 b = threadIdx.x; b < 256; b += blockDim.x) sh.hist[b] = 0;
            __syncthreads();
            for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
                const u32 key = order_key(L[i]);
                if (key > floor && (key & mask) == prefix) atomicAdd(&sh.hist[(key >> (8 * d)) & 255], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                u32 cum = 0;
                for (int b = 255; b >= 0; --b) {
                    if (cum + sh.hist[b] >= need) {
                        sh.bcast[0] = prefix | ((u32)b << (8 * d));
                        sh.bcast[1] = need - cum;
                        break;
                    }
                    cum += sh.hist[b];
                }
            }
            __syncthreads();
            prefix = sh.bcast[0];
            need = sh.bcast[1];
            mask |= 0xffu << (8 * d);
        }
        thr = prefix; // the k-th key; `need` of its ties are taken
    }
    const u32 chunk = (n + blockDim.x - 1) / blockDim.x;
    const u32 lo = min(n, threadIdx.x * chunk), hi = min(n, lo + chunk);
    u32 gt = 0, eq = 0;
    for (u32 i = lo; i < hi; ++i) {
        const u32 key = order_key(L[i]);
        gt += key > thr;
        eq += need > 0 && key == thr;
    }
    u32 n_gt, n_eq;
    u32 at_gt = block_scan(gt, sh.wu, &n_gt);
    u32 at_eq = block_scan(eq, sh.wu, &n_eq);
    for (u32 i = lo; i < hi; ++i) {
        const u32 key = order_key(L[i]);
        if (key > thr) {
            sh.cand_id[at_gt] = i, sh.cand_v[at_gt] = L[i];
            ++at_gt;
        } else if (need > 0 && key == thr) {
            if (at_eq < need) sh.cand_id[n_gt + at_eq] = i, sh.cand_v[n_gt + at_eq] = L[i];
            ++at_eq;
        }
    }
    __syncthreads();
    return n_gt + min(n_eq, need);
}

// cand_* (values scaled by `mul` first) sorted by (value desc, id asc)
// into sort_*.
__device__ void rank_sort(u32 m, float mul, Shared& sh) {
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) sh.cand_v[i] = __fmul_rn(sh.cand_v[i], mul);
    __syncthreads();
    for (u32 i = threadIdx.x; i < m; i += blockDim.x) {
        const float v = sh.cand_v[i];
        const u32 id = sh.cand_id[i];
        u32 r = 0;
        for (u32 q = 0; q < m; ++q) r += sh.cand_v[q] > v || (sh.cand_v[q] == v && sh.cand_id[q] < id);
        sh.sort_v[r] = v, sh.sort_id[r] = id;
    }
    __syncthreads();
}

// Thread 0: softmax, top-p, min-p and the draw over the m sorted
// candidates (the twin's order of operations).
__device__ u32 draw_sorted(u32 m, float top_p, float min_p, u64* rng, Shared& sh) {
    float mx = -INFINITY;
    for (u32 r = 0; r < m; ++r) mx = fmaxf(mx, sh.sort_v[r]);
    double sum = 0.0;
    for (u32 r = 0; r < m; ++r) sh.p[r] = expf(__fsub_rn(sh.sort_v[r], mx)), sum += (double)sh.p[r];
    float inv = (float)(1.0 / sum);
    for (u32 r = 0; r < m; ++r) sh.p[r] = __fmul_rn(sh.p[r], inv);
    if (top_p < 1.0f) {
        double cum = 0.0;
        u32 keep = m;
        for (u32 r = 0; r < m; ++r) {
            cum += (double)sh.p[r];
            if (cum >= (double)top_p) {
                keep = r + 1;
                break;
            }
        }
        m = keep;
        sum = 0.0;
        for (u32 r = 0; r < m; ++r) sum += (double)sh.p[r];
        if (sum > 0.0) {
            inv = (float)(1.0 / sum);
            for (u32 r = 0; r < m; ++r) sh.p[r] = __fmul_rn(sh.p[r], inv);
        }
    }
    if (min_p > 0.0f) {
        const float thr = __fmul_rn(min_p, sh.p[0]);
        u32 kept = 0;
        for (u32 r = 0; r < m; ++r)
            if (sh.p[r] >= thr) sh.p[kept] = sh.p[r], sh.sort_id[kept] = sh.sort_id[r], ++kept;
        m = kept;
        sum = 0.0;
        for (u32 r = 0; r < m; ++r) sum += (double)sh.p[r];
        if (sum > 0.0) {
            inv = (float)(1.0 / sum);
            for (u32 r = 0; r < m; ++r) sh.p[r] = __fmul_rn(sh.p[r], inv);
        }
    }
    double total = 0.0;
    for (u32 r = 0; r < m; ++r) total += (double)sh.p[r];
    double u = rng_next_f64(rng) * total;
    for (u32 r = 0; r < m; ++r) {
        u -= (double)sh.p[r];
        if (u < 0.0) return sh.sort_id[r];
    }
    return m > 0 ? sh.sort_id[m - 1] : NO_ID;
}

// The draw over the whole row in id order (no top-k; top_p is 1): the
// twin's softmax and min-p, each thread a contiguous run of ids.
__device__ u32 draw_all(const float* L, u32 n, float inv_t, float min_p, u64* rng, Shared& sh) {
    const u32 chunk = (n + blockDim.x - 1) / blockDim.x;
    const u32 lo = min(n, threadIdx.x * chunk), hi = min(n, lo + chunk);
    float mx = -INFINITY;
    for (u32 i = lo; i < hi; ++i)
        if (L[i] != -INFINITY) mx = fmaxf(mx, __fmul_rn(L[i], inv_t));
    mx = block_max(mx, sh.wf);
    if (mx == -INFINITY) return NO_ID;
    double s = 0.0;
    for (u32 i = lo; i < hi; ++i)
        if (L[i] != -INFINITY) s += (double)expf(__fsub_rn(__fmul_rn(L[i], inv_t), mx));
    const float inv = (float)(1.0 / block_sum(s, sh.wd));
    // p_i = exp(s_i - max) * inv; the largest is exp(0) * inv = inv.
    const float thr = min_p > 0.0f ? __fmul_rn(min_p, inv) : -1.0f;
    float inv2 = 1.0f;
    if (min_p > 0.0f) {
        s = 0.0;
        for (u32 i = lo; i < hi; ++i) {
            if (L[i] == -INFINITY) continue;
            const float p = __fmul_rn(expf(__fsub_rn(__fmul_rn(L[i], inv_t), mx)), inv);
            if (p >= thr) s += (double)p;
        }
        const double kept = block_sum(s, sh.wd);
        if (kept > 0.0) inv2 = (float)(1.0 / kept);
    }
    s = 0.0;
    u32 last = 0;
    for (u32 i = lo; i < hi; ++i) {
        if (L[i] == -INFINITY) continue;
        const float p = __fmul_rn(expf(__fsub_rn(__fmul_rn(L[i], inv_t), mx)), inv);
        if (p >= thr) s += (double)(min_p > 0.0f ? __fmul_rn(p, inv2) : p), last = i + 1;
    }
    double total;
    const double pre = block_scan(s, sh.wd, &total);
    if (threadIdx.x == 0) {
        sh.bcast_d = rng_next_f64(rng) * total;
        sh.bcast[2] = NO_ID;
    }
    __syncthreads();
    const double u = sh.bcast_d;
    if (s > 0.0 && u >= pre && u < pre + s) {
        double acc = pre;
        for (u32 i = lo; i < hi; ++i) {
            if (L[i] == -INFINITY) continue;
            float p = __fmul_rn(expf(__fsub_rn(__fmul_rn(L[i], inv_t), mx)), inv);
            if (p < thr) continue;
            if (min_p > 0.0f) p = __fmul_rn(p, inv2);
            acc += (double)p;
            if (acc > u) {
                atomicMin(&sh.bcast[2], i);
                break;
            }
        }
    }
    __syncthreads();
    const u32 picked = sh.bcast[2];
    // Rounding left u past every candidate: the last one, as the twin.
    if (picked != NO_ID) return picked;
    const float lastf = block_max(last > 0 ? (float)(last - 1) : -1.0f, sh.wf);
    return lastf >= 0.0f ? (u32)lastf : NO_ID;
}

// Whether a logit of the row is NaN or +inf (every thread gets it).
__device__ bool unsampleable(const float* L, u32 n) {
    int bad = 0;
    for (u32 i = threadIdx.x; i < n && !bad; i += blockDim.x) bad = L[i] != L[i] || L[i] == INFINITY;
    return __syncthreads_or(bad) != 0;
}

// See the file comment. `table` holds 2 words (an address) per head row.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(float* logits, u32 n_vocab, const u32* table, u32* ids, u32 id0) {
    __shared__ Shared sh;
    KERNEL_PROLOGUE();
    const u32 j = blockIdx.x;
    float* L = logits + (u64)j * n_vocab;
    const u64 addr = (u64)table[2 * j] | ((u64)table[2 * j + 1] << 32);
    if (addr == 0) {
        const u32 id = unsampleable(L, n_vocab) ? NO_ID : block_argmax(L, n_vocab, sh.wf, sh.wu);
        if (threadIdx.x == 0) ids[id0 + j] = id;
        return;
    }
    u32* st = (u32*)addr;
    const float* stf = (const float*)addr;
    const u32 last_n = st[S_LAST_N], nb = st[S_N_BIAS], seen = st[S_SEEN];
    const u32 bias0 = S_RING + last_n;
    for (u32 b = threadIdx.x; b < nb; b += blockDim.x) {
        const u32 id = st[bias0 + b];
        if (id < n_vocab) L[id] = __fadd_rn(L[id], stf[bias0 + nb + b]);
    }
    __syncthreads();
    if (last_n > 0) {
        const u32 nh = min(seen, last_n);
        const u32* ring = st + S_RING;
        const float rep = stf[S_REP], pres = stf[S_PRES], freq = stf[S_FREQ];
        for (u32 e = threadIdx.x; e < nh; e += blockDim.x) {
            const u32 t = ring[e];
            bool first = t < n_vocab;
            for (u32 q = 0; q < e && first; ++q) first = ring[q] != t;
            if (!first) continue;
            u32 count = 0;
            for (u32 q = 0; q < nh; ++q) count += ring[q] == t;
            float l = L[t];
            l = l > 0.0f ? __fdiv_rn(l, rep) : __fmul_rn(l, rep);
            L[t] = __fsub_rn(l, __fadd_rn(__fmul_rn((float)count, freq), pres));
        }
    }
    __syncthreads();
    if (unsampleable(L, n_vocab)) {
        if (threadIdx.x == 0) ids[id0 + j] = NO_ID;
        return;
    }
    u64 rng[4];
    for (int i = 0; i < 4; ++i) rng[i] = (u64)st[S_RNG + 2 * i] | ((u64)st[S_RNG + 2 * i + 1] << 32);
    const float temp = stf[S_TEMP];
    const u32 top_k = st[S_TOPK];
    u32 id;
    if (temp <= 0.0f) {
        id = block_argmax(L, n_vocab, sh.wf, sh.wu);
    } else {
        const float inv_t = __fdiv_rn(1.0f, temp);
        if (top_k > 0 && top_k < n_vocab) {
            const u32 m = select_top(L, n_vocab, min(top_k, (u32)TOPK_MAX), KEY_NEG_INF, sh);
            rank_sort(m, inv_t, sh);
            if (threadIdx.x == 0) sh.bcast[3] = m > 0 ? draw_sorted(m, stf[S_TOPP], stf[S_MINP], rng, sh) : NO_ID;
            __syncthreads();
            id = sh.bcast[3];
        } else {
            id = draw_all(L, n_vocab, inv_t, stf[S_MINP], rng, sh);
        }
    }
    if (id == NO_ID) {
        if (threadIdx.x == 0) ids[id0 + j] = NO_ID;
        return;
    }
    const u32 k_lp = min(st[S_N_LOGPROBS], (u32)LOGPROBS_MAX);
    if (k_lp > 0) {
        float mx = -INFINITY;
        for (u32 i = threadIdx.x; i < n_vocab; i += blockDim.x) mx = fmaxf(mx, L[i]);
        mx = block_max(mx, sh.wf);
        double s = 0.0;
        for (u32 i = threadIdx.x; i < n_vocab; i += blockDim.x) s += exp((double)L[i] - (double)mx);
        const double lse = (double)mx + log(block_sum(s, sh.wd));
        const u32 m = select_top(L, n_vocab, k_lp, 0u, sh);
        rank_sort(m, 1.0f, sh);
        for (u32 r = threadIdx.x; r < m; r += blockDim.x) {
            st[S_OUT + 2 + 2 * r] = sh.sort_id[r];
            st[S_OUT + 3 + 2 * r] = __float_as_uint((float)((double)sh.sort_v[r] - lse));
        }
        if (threadIdx.x == 0) st[S_OUT + 1] = __float_as_uint((float)((double)L[id] - lse));
    }
    if (threadIdx.x == 0) {
        if (temp > 0.0f)
            for (int i = 0; i < 4; ++i) st[S_RNG + 2 * i] = (u32)rng[i], st[S_RNG + 2 * i + 1] = (u32)(rng[i] >> 32);
        if (last_n > 0) st[S_RING + seen % last_n] = id;
        st[S_SEEN] = seen + 1;
        st[S_OUT] = id;
        ids[id0 + j] = id;
    }
}
