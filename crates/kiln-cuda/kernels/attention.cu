// Causal attention of one sequence over its cached and current K/V, f32
// throughout, online softmax (flash style): no score matrix in memory.
//
// Layouts (floats): q and out [rows, n_head * HD] from the sequence's first
// row; cur_k/cur_v [rows, n_kv_head * HD] likewise (positions p0..);
// past_k/past_v [past_rows, n_kv_head * HD], position pos in row
// pos % past_rows, holding positions max(0, p0 - past_rows)..p0. p0 is read
// from the step on the device (seq_p0[seq]), so a captured graph replays
// at new positions. Query t is at position p0 + t and sees keys
// lo..=p0 + t (lo: the window, and what the cache still holds).
//
// A warp owns R query rows (heads of one KV group, or tokens × heads); lane
// l holds elements l*E..l*E+E of each row's q and output (HD = 32 E).
// Keys are folded 8 at a time: each lane dots its slice of 8 key rows
// (coalesced loads), one reduce-scatter (9 shuffles per row) leaves the
// 8 scores spread over the lanes, then max, exp and the V rows' update.
//
// A batched decode call (kv != null) runs every one-row sequence of a
// step (its row at seq_row0[seq]; sequences of more rows, prefill chunks,
// are left to the prefill kernel), with grid z = sequence x row group: a
// sequence's cache addresses and rows come from its KvEntry in the step's
// table, its partials and counters from its own slice of the workspace.
// A zero entry (a padding row's sequence, at p0 = 0) has no past.
//
// Decode (one query token): split-K. Every warp takes `chunk` keys of the
// visible range and writes a partial (max, sum, unnormalised output); the
// last block of each (KV head, row group) to finish combines them (one
// kernel, no merge launch). Prefill: every warp folds all keys its rows
// see, then normalises in place.

#define TILE 8

// One sequence's cache of one layer, in the step's KV table (step.rs).
struct KvEntry {
    float* k;
    float* v;
    u32 rows;
    u32 pad_;
};

struct AttnArgs {
    const float* q;
    const float* cur_k;
    const float* cur_v;
    const float* past_k; // null when past_rows == 0
    const float* past_v;
    float* out;      // prefill output
    float* part_acc; // decode partials [seq][n_head][n_splits][HD]
    float* part_ml;  // decode partials [seq][n_head][n_splits][2]: max, sum
    const u32* seq_p0;
    u32* done; // decode: finished blocks per (KV head, row group); 0 between calls
    const KvEntry* kv; // batched decode: the layer's table, an entry per sequence; else null
    const u32* seq_end;  // batched decode: each sequence's p0 + rows
    const u32* seq_row0; // batched decode: each sequence's first row
    u32 seq;
    u32 n_tok;
    u32 n_head;
    u32 n_kv_head;
    u32 past_rows; // 0: no past
    u32 window;    // 0: none
    u32 chunk;     // decode: keys per split
    float scale;
    float softcap; // 0: none
    u32 row_groups; // decode: grid z = sequences x row_groups
};

// As load_slice, through L2 only: what other blocks of the same kernel wrote
// (an SM's L1 is not coherent with them).
template <int E>
__device__ __forceinline__ void load_slice_l2(const float* p, float (&v)[E]) {
    if (E % 4 == 0) {
#pragma unroll
        for (int i = 0; i < E / 4; ++i) {
            const float4 t = __ldcg(reinterpret_cast<const float4*>(p) + i);
            v[4 * i] = t.x; v[4 * i + 1] = t.y; v[4 * i + 2] = t.z; v[4 * i + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i) v[i] = __ldcg(p + i);
    }
}

template <int E>
__device__ __forceinline__ void load_slice(const float* p, float (&v)[E]) {
    if (E % 4 == 0) {
#pragma unroll
        for (int i = 0; i < E / 4; ++i) {
            const float4 t = reinterpret_cast<const float4*>(p)[i];
            v[4 * i] = t.x; v[4 * i + 1] = t.y; v[4 * i + 2] = t.z; v[4 * i + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < E; ++i) v[i] = p[i];
    }
}

// Row of key position kp: the cache ring before p0, the current rows after.
__device__ __forceinline__ const float* kv_row(const float* past, const float* cur, u32 past_rows,
                                               u32 p0, u32 kp, u32 kvd) {
    return kp < p0 ? past + (u64)(kp % past_rows) * kvd : cur + (u64)(kp - p0) * kvd;
}

// First key a query at `pos` sees.
__device__ __forceinline__ u32 first_key(const AttnArgs& a, u32 p0, u32 pos) {
    const u32 held = a.past_rows == 0 ? p0 : (p0 > a.past_rows ? p0 - a.past_rows : 0);
    const u32 win = (a.window != 0 && pos + 1 > a.window) ? pos + 1 - a.window : 0;
    return held > win ? held : win;
}

// v[0..8] summed over the warp; afterwards lane l holds key (l >> 2) & 7.
__device__ __forceinline__ float reduce_scatter8(float (&v)[TILE], u32 lane) {
    float w[4], x[2];
    const bool b4 = lane & 16, b3 = lane & 8, b2 = lane & 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float keep = b4 ? v[i + 4] : v[i], send = b4 ? v[i] : v[i + 4];
        w[i] = keep + __shfl_xor_sync(FULL_MASK, send, 16);
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float keep = b3 ? w[i + 2] : w[i], send = b3 ? w[i] : w[i + 2];
        x[i] = keep + __shfl_xor_sync(FULL_MASK, send, 8);
    }
    float y = (b2 ? x[1] : x[0]) + __shfl_xor_sync(FULL_MASK, b2 ? x[0] : x[1], 4);
    y += __shfl_xor_sync(FULL_MASK, y, 2);
    y += __shfl_xor_sync(FULL_MASK, y, 1);
    return y;
}

// Over the 8 keys of a tile (lanes differing in bits 2..4).
__device__ __forceinline__ float tile_max(float v) {
    v = nan_max(v, __shfl_xor_sync(FULL_MASK, v, 4));
    v = nan_max(v, __shfl_xor_sync(FULL_MASK, v, 8));
    return nan_max(v, __shfl_xor_sync(FULL_MASK, v, 16));
}

__device__ __forceinline__ float tile_sum(float v) {
    v += __shfl_xor_sync(FULL_MASK, v, 4);
    v += __shfl_xor_sync(FULL_MASK, v, 8);
    return v + __shfl_xor_sync(FULL_MASK, v, 16);
}

// Online-softmax state of a warp's R query rows. Row r sees keys
// lo[r]..=hi[r]; a padding row has lo > hi.
template <int E, int R>
struct Rows {
    float q[R][E];
    float acc[R][E];
    float m[R], l[R];
    u32 lo[R], hi[R];
};

// The lane's slices of the rows of positions k0..k0 + N (clamped to
// kend - 1) of K or V, all loads issued before any is used.
template <int E, int N>
__device__ __forceinline__ void load_rows(float (&out)[N][E], const float* past, const float* cur,
                                          u32 past_rows, u32 p0, u32 k0, u32 kend, u32 off, u32 kvd) {
#pragma unroll
    for (int j = 0; j < N; ++j) {
        const u32 kp = min(k0 + j, kend - 1);
        load_slice<E>(kv_row(past, cur, past_rows, p0, kp, kvd) + off, out[j]);
    }
}

// Folds key positions k0..min(k0 + 8, kend) into the rows' state. `off` is
// the lane's offset into a K/V row (kv head and lane slice).
//
// Branch-free on purpose: keys past `kend` load row kend - 1 again (their
// weight is 0), so the compiler issues a batch's row loads together; with
// a branch around each load it waits out one memory round trip per key.
// Where a whole tile's slices fit (E <= 8: head dim 256, and up to 32 / E
// rows a warp: registers), the V rows are requested with the K rows, not
// after the scores: one memory round trip a tile instead of two (a decode
// split folds its keys tile after tile).
template <int E, int R>
__device__ __forceinline__ void fold_tile(Rows<E, R>& s, const AttnArgs& a, u32 p0, u32 k0, u32 kend,
                                          u32 off, u32 kvd, u32 lane) {
    // Rows whose slices are held at once (E = 16: half a tile, for registers).
    constexpr int BATCH = E >= 16 ? TILE / 2 : TILE;
    constexpr bool V_EARLY = BATCH == TILE && E * R <= 32;
    float v_early[V_EARLY ? TILE : 1][E];
    if constexpr (V_EARLY) load_rows(v_early, a.past_v, a.cur_v, a.past_rows, p0, k0, kend, off, kvd);
    float part[R][TILE];
#pragma unroll
    for (int j0 = 0; j0 < TILE; j0 += BATCH) {
        float k[BATCH][E];
        load_rows(k, a.past_k, a.cur_k, a.past_rows, p0, k0 + j0, kend, off, kvd);
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float d = 0.0f;
#pragma unroll
                for (int e = 0; e < E; ++e) d += s.q[r][e] * k[j][e];
                part[r][j0 + j] = d;
            }
        }
    }
    const u32 kp = k0 + ((lane >> 2) & 7); // this lane's key after the scatter
    float p[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        float sc = reduce_scatter8(part[r], lane) * a.scale;
        if (a.softcap != 0.0f) sc = softcap(sc, a.softcap);
        const bool vis = kp < kend && kp >= s.lo[r] && kp <= s.hi[r];
        sc = vis ? sc : -INFINITY;
        const float mx = nan_max(s.m[r], tile_max(sc));
        // Nothing visible to this row yet (mx = -inf): exponents against 0
        // keep everything at 0 instead of NaN. exp(-inf) = 0 clears the
        // empty initial state.
        const float base = mx == -INFINITY ? 0.0f : mx;
        const float corr = expf(s.m[r] - base);
        p[r] = vis ? expf(sc - base) : 0.0f;
        s.l[r] = s.l[r] * corr + tile_sum(p[r]);
        s.m[r] = mx;
#pragma unroll
        for (int e = 0; e < E; ++e) s.acc[r][e] *= corr;
    }
#pragma unroll
    for (int j0 = 0; j0 < TILE; j0 += BATCH) {
        float v_late[V_EARLY ? 1 : BATCH][E];
        if constexpr (!V_EARLY) load_rows(v_late, a.past_v, a.cur_v, a.past_rows, p0, k0 + j0, kend, off, kvd);
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const float* vj = V_EARLY ? v_early[j0 + j] : v_late[V_EARLY ? 0 : j];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float pj = __shfl_sync(FULL_MASK, p[r], (j0 + j) * 4);
#pragma unroll
                for (int e = 0; e < E; ++e) s.acc[r][e] += pj * vj[e];
            }
        }
    }
}

template <int E, int R>
__device__ __forceinline__ void init_rows(Rows<E, R>& s) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
        s.m[r] = -INFINITY;
        s.l[r] = 0.0f;
        s.lo[r] = 1;
        s.hi[r] = 0;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            s.q[r][e] = 0.0f;
            s.acc[r][e] = 0.0f;
        }
    }
}

// The output of head h for one query token: its splits' partials combined,
// sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s, by one warp (lane l
// holds elements l*E..). Splits in order, as the CPU folds its keys.
template <int E>
__device__ void merge_head(const AttnArgs& a, u32 h, u32 n_splits) {
    const u32 lane = threadIdx.x % WARP, hd = E * WARP;
    const float* ml = a.part_ml + (u64)h * n_splits * 2;
    float mx = -INFINITY;
    for (u32 s = lane; s < n_splits; s += WARP) mx = nan_max(mx, __ldcg(ml + 2 * s));
    mx = warp_max(mx);
    const float* acc = a.part_acc + (u64)h * n_splits * hd + lane * E;
    float l = 0.0f, o[E];
#pragma unroll
    for (int e = 0; e < E; ++e) o[e] = 0.0f;
    // Eight splits' loads in flight a lane for head dim 256, four for 512
    // (registers): the merge waits on L2, not on its few FMAs.
#pragma unroll(E <= 8 ? 8 : 4)
    for (u32 s = 0; s < n_splits; ++s) {
        // An empty split (m = -inf, acc 0) weighs 0.
        const float m = __ldcg(ml + 2 * s);
        const float w = m == -INFINITY ? 0.0f : expf(m - mx);
        l += w * __ldcg(ml + 2 * s + 1);
        float v[E];
        load_slice_l2<E>(acc + (u64)s * hd, v);
#pragma unroll
        for (int e = 0; e < E; ++e) o[e] += w * v[e];
    }
    const float inv = 1.0f / l;
    float* out = a.out + (u64)h * hd + lane * E;
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = o[e] * inv;
}

// Decode: grid (split blocks, n_kv_head, row groups of R heads), each warp
// one split of `chunk` keys, writing its partials; the block that finishes
// last in its (KV head, row group) merges them, a warp per head.
template <int E, int R>
__device__ void attn_decode(const AttnArgs& args) {
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 n_splits = gridDim.x * (blockDim.x / WARP);
    const u32 split = blockIdx.x * (blockDim.x / WARP) + warp;
    const u32 kvh = blockIdx.y, g = args.n_head / args.n_kv_head;
    const u32 hd = E * WARP, kvd = args.n_kv_head * hd;
    const u32 rg = blockIdx.z % args.row_groups, sq = blockIdx.z / args.row_groups;
    AttnArgs a = args;
    if (a.kv != nullptr) {
        // Whole blocks leave together (before any barrier); a sequence
        // whose blocks all leave never touches its counters.
        if (a.seq_end[sq] - a.seq_p0[sq] != 1) return;
        const u32 row = a.seq_row0[sq];
        const KvEntry e = a.kv[sq];
        const u32 qd = a.n_head * hd;
        a.past_k = e.k;
        a.past_v = e.v;
        a.past_rows = e.k == nullptr ? 0 : e.rows;
        a.seq = sq;
        a.q += (u64)row * qd;
        a.out += (u64)row * qd;
        a.cur_k += (u64)row * kvd;
        a.cur_v += (u64)row * kvd;
        a.part_acc += (u64)sq * a.n_head * n_splits * hd;
        a.part_ml += (u64)sq * a.n_head * n_splits * 2;
        a.done += (u64)sq * gridDim.y * a.row_groups;
    }
    Rows<E, R> s;
    init_rows(s);
    // The queries' loads go out before p0's, which the rest waits for.
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const u32 hg = rg * R + r;
        if (hg < g) load_slice<E>(a.q + (kvh * g + hg) * hd + lane * E, s.q[r]);
    }
    const u32 p0 = a.seq_p0[a.seq], pos = p0;
    const u32 lo = first_key(a, p0, pos);
    const u32 k_begin = lo + split * a.chunk;
    const u32 k_end = min(k_begin + a.chunk, pos + 1);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (rg * R + r < g) {
            s.lo[r] = lo;
            s.hi[r] = pos;
        }
    }
    for (u32 k0 = k_begin; k0 < k_end; k0 += TILE) {
        fold_tile(s, a, p0, k0, k_end, kvh * hd + lane * E, kvd, lane);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const u32 hg = rg * R + r;
        if (hg >= g) continue;
        const u64 at = (u64)(kvh * g + hg) * n_splits + split;
        float* acc = a.part_acc + at * hd + lane * E;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[e] = s.acc[r][e];
        if (lane == 0) {
            a.part_ml[2 * at] = s.m[r];
            a.part_ml[2 * at + 1] = s.l[r];
        }
    }
    // Partials out to L2 before this block counts itself done.
    __shared__ u32 last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32* done = a.done + blockIdx.y * a.row_groups + rg;
        last = atomicAdd(done, 1u) == gridDim.x - 1;
        if (last) *done = 0; // every block has counted: ready for the next call
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (u32 r = warp; r < R; r += blockDim.x / WARP) {
        const u32 hg = rg * R + r;
        if (hg < g) merge_head<E>(a, kvh * g + hg, n_splits);
    }
}

// Prefill: grid (row blocks, n_kv_head); warp w of block b owns rows
// (b * warps + w) * R + r of the (token, head-in-group) list, t * g + h.
template <int E, int R>
__device__ void attn_prefill(const AttnArgs& a) {
    const u32 lane = threadIdx.x % WARP, warp = threadIdx.x / WARP;
    const u32 kvh = blockIdx.y, g = a.n_head / a.n_kv_head;
    const u32 hd = E * WARP, kvd = a.n_kv_head * hd, qd = a.n_head * hd;
    const u32 p0 = a.seq_p0[a.seq];
    const u32 row0 = (blockIdx.x * (blockDim.x / WARP) + warp) * R;
    Rows<E, R> s;
    init_rows(s);
    u32 klo = 0xffffffffu, khi = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const u32 i = row0 + r, t = i / g, h = kvh * g + i % g;
        if (t < a.n_tok) {
            load_slice<E>(a.q + (u64)t * qd + h * hd + lane * E, s.q[r]);
            s.lo[r] = first_key(a, p0, p0 + t);
            s.hi[r] = p0 + t;
            klo = min(klo, s.lo[r]);
            khi = max(khi, s.hi[r]);
        }
    }
    if (klo > khi) return; // padding warp
    for (u32 k0 = klo; k0 <= khi; k0 += TILE) {
        fold_tile(s, a, p0, k0, khi + 1, kvh * hd + lane * E, kvd, lane);
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const u32 i = row0 + r, t = i / g, h = kvh * g + i % g;
        if (t >= a.n_tok) continue;
        const float inv = 1.0f / s.l[r];
        float* o = a.out + (u64)t * qd + h * hd + lane * E;
#pragma unroll
        for (int e = 0; e < E; ++e) o[e] = s.acc[r][e] * inv;
    }
}

#define DECODE(E, R) \
    extern "C" __global__ void attn_decode_e##E##_r##R(const AttnArgs a) { KERNEL_PROLOGUE(); attn_decode<E, R>(a); }
#define PREFILL(E, R) \
    extern "C" __global__ void attn_prefill_e##E##_r##R(const AttnArgs a) { KERNEL_PROLOGUE(); attn_prefill<E, R>(a); }
#define FAMILY(E) DECODE(E, 1) DECODE(E, 2) DECODE(E, 4) PREFILL(E, 4)
FAMILY(1)
FAMILY(2)
FAMILY(4)
FAMILY(8)
FAMILY(16)
DECODE(1, 8)
DECODE(2, 8)
DECODE(4, 8)
DECODE(8, 8)

// Stores every step row's K/V in its sequence's cache of one layer: row t
// (of sequence row_seq[t], at positions[t]) into the cache its KvEntry
// names, row pos % rows of a ring (a ring keeps only the rows no later row
// of the same sequence overwrites: pos + rows >= the sequence's end), row
// pos otherwise. Rows of a sequence without an entry (padding) go nowhere.
extern "C" __global__ void store_kv_batch(const float* k, const float* v, const KvEntry* kv,
                                          const u32* row_seq, const u32* positions,
                                          const u32* seq_end, u32 n, u32 row_len, u32 ring) {
    KERNEL_PROLOGUE();
    GRID_STRIDE(i, (u64)n * row_len) {
        const u32 t = (u32)(i / row_len), c = (u32)(i % row_len);
        const u32 sq = row_seq[t];
        const KvEntry e = kv[sq];
        if (e.k == nullptr || e.rows == 0) continue;
        const u64 pos = positions[t];
        if (ring && pos + e.rows < seq_end[sq]) continue;
        const u64 slot = ring ? pos % e.rows : pos;
        if (slot >= e.rows) continue; // checked on the host for this step
        const u64 d = slot * row_len + c;
        e.k[d] = k[i];
        e.v[d] = v[i];
    }
}
