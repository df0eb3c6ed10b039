//! Helpers shared by the unit tests of the screens.

/// Xorshift64 from `seed`.
pub(crate) fn xorshift(mut s: u64) -> impl FnMut() -> u64 {
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// `rows` Q8_0 rows of `k` values: scales in ±0.05, random codes.
pub(crate) fn random_q8_0(rows: usize, k: usize, rnd: &mut impl FnMut() -> u64) -> Vec<u8> {
    let mut w = vec![0u8; rows * (k / 32 * 34)];
    for blk in w.chunks_exact_mut(34) {
        let d = half::f16::from_f32((rnd() % 1001) as f32 * 1e-4 - 0.05);
        blk[..2].copy_from_slice(&d.to_le_bytes());
        for b in &mut blk[2..] {
            *b = rnd() as u8;
        }
    }
    w
}
