// quant.cuh: the one device-side decoder of every GGML weight type the CUDA
// backend reads. Layouts and arithmetic mirror crates/kiln-quant
// (block.rs, dequant.rs); every kernel in matmul.cu decodes through the
// `codes` / `affine` pair of its type below, so a layout lives in exactly
// one place on the GPU.
//
// The unit of work is 8 consecutive elements of a row ("unit" u covers
// elements 8u .. 8u+7). Every supported layout keeps such a run inside one
// block, under one scale, in contiguous bytes, so a unit decodes to
//     w[i] = d * q[i] + m      (m == 0 for types without a min)
// where q[i] are small integers (`codes`; for F32/F16/BF16 the values,
// with d = 1) and (d, m) the unit's `affine`. Units 2p and 2p+1 always
// share their affine (scale groups are 16 or more elements), which the
// GEMV uses to decode scales once per pair. Kernels that need the weights themselves use `unit_weight`, which
// rounds exactly as kiln-quant's scalar dequantizer (a product, then a sum,
// never fused), so dequantized rows are bit-identical to the CPU's. Dot
// kernels instead compute d * sum(q x) + m * sum(x): one FMA per element.
//
// Alignment: rows start at multiples of their byte length from a 16-byte
// aligned base (the host checks the base), so each type's loads below use
// the widest access its block size allows (noted per type).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

// The scale and min of a unit (m == 0 for types without a min).
struct Affine {
    float d, m;
};

struct Unit {
    float q[8];
    Affine a;
};

__device__ __forceinline__ u32 ld_u16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ u32 ld_u32(const u8* p) { return *(const u32*)p; }
// Four bytes at a 2-byte aligned address.
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }
// Eight bytes at a 2-byte aligned address, as two words.
__device__ __forceinline__ uint2 ld_8_a2(const u8* p) { return make_uint2(ld_u32_a2(p), ld_u32_a2(p + 4)); }
__device__ __forceinline__ uint2 ld_8_a4(const u8* p) { return make_uint2(ld_u32(p), ld_u32(p + 4)); }
__device__ __forceinline__ uint2 ld_8_a8(const u8* p) { return *(const uint2*)p; }

// IEEE half -> float, exact (subnormals, inf and NaN included).
__device__ __forceinline__ float f16_to_f32(u32 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((u16)h));
    return f;
}
__device__ __forceinline__ float bf16_to_f32(u32 h) { return __uint_as_float((h & 0xFFFF) << 16); }

// Codes are handled as 8 bytes (one per element) in a uint2, four at a time
// in each word: per-byte bit fields are cut out with one shift and mask per
// word. The byte shifts below never mix neighbouring bytes into the kept
// bits, because every mask fits the bits left after its shift.

// Per byte: (byte >> shift) & mask.
__device__ __forceinline__ uint2 bytes_field(uint2 v, int shift, u32 mask) {
    const u32 m = mask * 0x01010101u;
    return make_uint2((v.x >> shift) & m, (v.y >> shift) & m);
}
__device__ __forceinline__ uint2 bytes_or(uint2 a, uint2 b) { return make_uint2(a.x | b.x, a.y | b.y); }
__device__ __forceinline__ uint2 bytes_shl(uint2 a, int s) { return make_uint2(a.x << s, a.y << s); }
// Bits 0..7 of `bits` spread to bit 0 of bytes 0..7 (the multiply puts bit
// k of a nibble at bit 8k; the four shifted copies do not overlap).
__device__ __forceinline__ uint2 bits_to_bytes(u32 bits) {
    return make_uint2(((bits & 0xF) * 0x00204081u) & 0x01010101u, (((bits >> 4) & 0xF) * 0x00204081u) & 0x01010101u);
}

// q[i] = (byte i of codes) - bias, exactly. PRMT builds the float 2^23 +
// code (the code in the low mantissa bits) and one subtraction removes 2^23
// + bias: two full-rate ops instead of an integer-to-float conversion,
// which sm_90 issues at a quarter of the FMA rate and would hold the 4-bit
// GEMVs below the memory bandwidth.
__device__ __forceinline__ void code_floats(uint2 codes, float bias, float* q) {
#pragma unroll
    for (int i = 0; i < 8; i++)
        q[i] = __uint_as_float(__byte_perm(i < 4 ? codes.x : codes.y, 0x4B000000u, 0x7540u | (i & 3))) -
               (8388608.0f + bias);
}

// Each quantized type gives raw(b, j), unit j's eight codes as bytes, and
// BIAS: element i weighs d * (code_i - BIAS) + m, and codes() is their
// floats (the integer dot products of qdot.cu use the bytes themselves).

// ---- legacy 32-element blocks ---------------------------------------------
// Element e of Q4_x / Q5_x sits in byte e % 16 of qs, low nibble for e < 16:
// unit j reads bytes 8 (j & 1) .. +8 and nibble j >> 1. In Q5_x, bit e of
// the qh word is the fifth bit of element e.

// block_q4_0 (18 bytes, 2-aligned): d f16 @0, qs[16] @2. w = d * (q - 8).
struct q4_0 {
    static constexpr int QK = 32, BYTES = 18;
    static constexpr bool HAS_MIN = false;
    static constexpr float BIAS = 8.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        return bytes_field(ld_8_a2(b + 2 + 8 * (j & 1)), 4 * (j >> 1), 0xF);
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int) { return {f16_to_f32(ld_u16(b)), 0.0f}; }
};

// block_q4_1 (20 bytes, 4-aligned): d @0, m @2, qs[16] @4. w = d * q + m.
struct q4_1 {
    static constexpr int QK = 32, BYTES = 20;
    static constexpr bool HAS_MIN = true;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        return bytes_field(ld_8_a4(b + 4 + 8 * (j & 1)), 4 * (j >> 1), 0xF);
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int) {
        return {f16_to_f32(ld_u16(b)), f16_to_f32(ld_u16(b + 2))};
    }
};

// Five-bit codes of unit j: nibbles from `qs8`, fifth bits from `qh`.
__device__ __forceinline__ uint2 q5_codes(uint2 qs8, u32 qh, int j) {
    return bytes_or(bytes_field(qs8, 4 * (j >> 1), 0xF), bytes_shl(bits_to_bytes(qh >> (8 * j)), 4));
}

// block_q5_0 (22 bytes, 2-aligned): d @0, qh u32 @2, qs[16] @6. w = d * (q - 16).
struct q5_0 {
    static constexpr int QK = 32, BYTES = 22;
    static constexpr bool HAS_MIN = false;
    static constexpr float BIAS = 16.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        return q5_codes(ld_8_a2(b + 6 + 8 * (j & 1)), ld_u32_a2(b + 2), j);
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int) { return {f16_to_f32(ld_u16(b)), 0.0f}; }
};

// block_q5_1 (24 bytes, 8-aligned): d @0, m @2, qh @4, qs[16] @8. w = d * q + m.
struct q5_1 {
    static constexpr int QK = 32, BYTES = 24;
    static constexpr bool HAS_MIN = true;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        return q5_codes(ld_8_a8(b + 8 + 8 * (j & 1)), ld_u32(b + 4), j);
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int) {
        return {f16_to_f32(ld_u16(b)), f16_to_f32(ld_u16(b + 2))};
    }
};

// block_q8_0 (34 bytes, 2-aligned): d @0, qs[32] i8 @2. w = d * q, with
// q = (byte ^ 0x80) - 128.
struct q8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static constexpr bool HAS_MIN = false;
    static constexpr float BIAS = 128.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        const uint2 v = ld_8_a2(b + 2 + 8 * j);
        return make_uint2(v.x ^ 0x80808080u, v.y ^ 0x80808080u);
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int) { return {f16_to_f32(ld_u16(b)), 0.0f}; }
};

// ---- K-quants: 256-element super-blocks ------------------------------------
// Q2_K / Q3_K / Q6_K have 16 groups of 16 (unit j is half of group j / 2);
// Q4_K / Q5_K have 8 groups of 32 (unit j is a quarter of group j / 4).

// block_q2_K (84 bytes, 4-aligned): scales[16] @0, qs[64] @16, d @80, dmin @82.
// Element 16g + l: byte 32 (g / 8) + 16 (g % 2) + l of qs, bits 2 ((g % 8) / 2).
// w = (d * sc) * q - (dmin * min).
struct q2_k {
    static constexpr int QK = 256, BYTES = 84;
    static constexpr bool HAS_MIN = true;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        const int g = j >> 1;
        const uint2 qs = ld_8_a4(b + 16 + 32 * (g >> 3) + 16 * (g & 1) + 8 * (j & 1));
        return bytes_field(qs, 2 * ((g & 7) >> 1), 3);
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int j) {
        const u32 sc = b[j >> 1];
        return {f16_to_f32(ld_u16(b + 80)) * (float)(sc & 0xF), -(f16_to_f32(ld_u16(b + 82)) * (float)(sc >> 4))};
    }
};

// block_q3_K (110 bytes, 2-aligned): hmask[32] @0, qs[64] @32 (as Q2_K),
// scales[12] @96 (sixteen 6-bit values, biased by 32), d @108.
// The high bit of element e is bit e / 32 of hmask[e % 32], stored
// inverted: clear means q - 4, so code = low + 4 * high, minus 4.
// w = (d * (sc - 32)) * q.
struct q3_k {
    static constexpr int QK = 256, BYTES = 110;
    static constexpr bool HAS_MIN = false;
    static constexpr float BIAS = 4.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        const int g = j >> 1;
        const int l0 = 16 * (g & 1) + 8 * (j & 1);
        const uint2 low = bytes_field(ld_8_a2(b + 32 + 32 * (g >> 3) + l0), 2 * ((g & 7) >> 1), 3);
        const uint2 high = bytes_field(ld_8_a2(b + l0), g >> 1, 1);
        return bytes_or(low, bytes_shl(high, 2));
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int j) {
        const int g = j >> 1;
        const u8* s = b + 96;
        const u32 sc = ((s[g & 7] >> (4 * (g >> 3))) & 0xF) | (((s[8 + (g & 3)] >> (2 * (g >> 2))) & 3) << 4);
        return {f16_to_f32(ld_u16(b + 108)) * (float)((int)sc - 32), 0.0f};
    }
};

// The affine of group g of a Q4_K / Q5_K block: d * sc and -(dmin * min),
// with the 6-bit scale and min unpacked as kiln-quant's scale_min_k4:
// groups 0..4 in the low six bits of scales bytes 0..8; groups 4..8 keep
// low nibbles in bytes 8..12 and top bits in bytes 0..8.
__device__ __forceinline__ Affine k4_affine(const u8* b, int g) {
    const u8* s = b + 4;
    u32 sc, mn;
    if (g < 4) {
        sc = s[g] & 63;
        mn = s[g + 4] & 63;
    } else {
        sc = (s[g + 4] & 0xF) | ((s[g - 4] >> 6) << 4);
        mn = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
    }
    return {f16_to_f32(ld_u16(b)) * (float)sc, -(f16_to_f32(ld_u16(b + 2)) * (float)mn)};
}

// block_q4_K (144 bytes, 16-aligned): d @0, dmin @2, scales[12] @4, qs[128] @16.
// Groups 2k and 2k+1 share bytes 32k .. 32k+32 of qs: low then high nibble.
// w = (d * sc) * q - (dmin * min).
struct q4_k {
    static constexpr int QK = 256, BYTES = 144;
    static constexpr bool HAS_MIN = true;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        const int g = j >> 2;
        return bytes_field(ld_8_a8(b + 16 + 32 * (g >> 1) + 8 * (j & 3)), 4 * (g & 1), 0xF);
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int j) { return k4_affine(b, j >> 2); }
};

// block_q5_K (176 bytes, 16-aligned): Q4_K plus qh[32] @16 (bit g of byte
// l: the fifth bit of element l of group g); qs[128] @48.
struct q5_k {
    static constexpr int QK = 256, BYTES = 176;
    static constexpr bool HAS_MIN = true;
    static constexpr float BIAS = 0.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        const int g = j >> 2;
        const int l0 = 8 * (j & 3);
        const uint2 low = bytes_field(ld_8_a8(b + 48 + 32 * (g >> 1) + l0), 4 * (g & 1), 0xF);
        const uint2 high = bytes_field(ld_8_a8(b + 16 + l0), g, 1);
        return bytes_or(low, bytes_shl(high, 4));
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int j) { return k4_affine(b, j >> 2); }
};

// block_q6_K (210 bytes, 2-aligned): ql[128] @0, qh[64] @128, scales[16] i8
// @192, d @208. In 128-element half h, quarter k (32 elements) takes nibble
// k / 2 of ql bytes 64h + 32 (k % 2) .. +32 and bits 2k of qh bytes 32h ..
// +32. w = (d * sc) * (q - 32).
struct q6_k {
    static constexpr int QK = 256, BYTES = 210;
    static constexpr bool HAS_MIN = false;
    static constexpr float BIAS = 32.0f;
    static __device__ __forceinline__ uint2 raw(const u8* b, int j) {
        const int g = j >> 1;
        const int h = g >> 3, k = (g & 7) >> 1;
        const int l0 = 16 * (g & 1) + 8 * (j & 1);
        const uint2 low = bytes_field(ld_8_a2(b + 64 * h + 32 * (k & 1) + l0), 4 * (k >> 1), 0xF);
        const uint2 high = bytes_field(ld_8_a2(b + 128 + 32 * h + l0), 2 * k, 3);
        return bytes_or(low, bytes_shl(high, 4));
    }
    static __device__ __forceinline__ void codes(const u8* b, int j, float* q) { code_floats(raw(b, j), BIAS, q); }
    static __device__ __forceinline__ Affine affine(const u8* b, int j) {
        return {f16_to_f32(ld_u16(b + 208)) * (float)(int)(signed char)b[192 + (j >> 1)], 0.0f};
    }
};

// ---- plain types: a "block" is one unit of 8 values, w = value -----------

// 32 bytes, 32-aligned (rows of 8k floats).
struct f32 {
    static constexpr int QK = 8, BYTES = 32;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void codes(const u8* b, int, float* q) {
        const float4 a = ((const float4*)b)[0], c = ((const float4*)b)[1];
        q[0] = a.x, q[1] = a.y, q[2] = a.z, q[3] = a.w;
        q[4] = c.x, q[5] = c.y, q[6] = c.z, q[7] = c.w;
    }
    static __device__ __forceinline__ Affine affine(const u8*, int) { return {1.0f, 0.0f}; }
};

// Eight 16-bit values (IEEE half, or bfloat16 when BF) from one 16-byte load.
template <bool BF>
__device__ __forceinline__ void codes16(const u8* b, float* q) {
    const uint4 v = *(const uint4*)b;
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const u32 h = (w[i >> 1] >> (16 * (i & 1))) & 0xFFFF;
        q[i] = BF ? bf16_to_f32(h) : f16_to_f32(h);
    }
}

struct f16 {
    static constexpr int QK = 8, BYTES = 16;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void codes(const u8* b, int, float* q) { codes16<false>(b, q); }
    static __device__ __forceinline__ Affine affine(const u8*, int) { return {1.0f, 0.0f}; }
};

struct bf16 {
    static constexpr int QK = 8, BYTES = 16;
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void codes(const u8* b, int, float* q) { codes16<true>(b, q); }
    static __device__ __forceinline__ Affine affine(const u8*, int) { return {1.0f, 0.0f}; }
};

// ---- row access shared by every kernel -------------------------------------

// The block holding unit u (elements 8u .. 8u+7) of the row at `row`, and
// the unit's index in it.
template <class T>
__device__ __forceinline__ const u8* unit_block(const u8* row, int u, int& j) {
    constexpr int UNITS = T::QK / 8;
    j = u % UNITS;
    return row + (size_t)(u / UNITS) * T::BYTES;
}

// Unit u of the row at `row`: its codes and affine.
template <class T>
__device__ __forceinline__ void load_unit(const u8* row, int u, Unit& out) {
    int j;
    const u8* b = unit_block<T>(row, u, j);
    T::codes(b, j, out.q);
    out.a = T::affine(b, j);
}

// Weight i of a decoded unit, rounded as kiln-quant's dequantizer: the
// product d * q, then the min (no FMA contraction).
template <class T>
__device__ __forceinline__ float unit_weight(const Unit& u, int i) {
    const float w = __fmul_rn(u.a.d, u.q[i]);
    return T::HAS_MIN ? __fadd_rn(w, u.a.m) : w;
}
