//! A tiny seeded generator: weights only need to be reproducible and
//! roughly Gaussian, and seeding per chunk keeps the output independent of
//! how rayon splits the work.

/// SplitMix64: one multiply-xorshift per draw, good enough statistics for
/// random weights and trivially seekable by re-seeding.
pub(crate) struct Rng(u64);

impl Rng {
    /// A stream for one (seed, tensor, chunk) triple.
    pub(crate) fn new(seed: u64, tensor: u64, chunk: u64) -> Rng {
        let mut r = Rng(seed ^ 0x9E37_79B9_7F4A_7C15);
        r.0 ^= r
            .next_u64()
            .wrapping_add(tensor.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.0 ^= r
            .next_u64()
            .wrapping_add(chunk.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7));
        r
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1]: never 0, so `ln` below is finite.
    pub(crate) fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 1.0) * (1.0 / (1u64 << 24) as f32)
    }

    /// Fills `out` with N(mean, std²) by Box-Muller (two values per draw).
    pub(crate) fn fill_normal(&mut self, out: &mut [f32], mean: f32, std: f32) {
        for pair in out.chunks_mut(2) {
            let r = (-2.0 * self.uniform().ln()).sqrt() * std;
            let (s, c) = (std::f32::consts::TAU * self.uniform()).sin_cos();
            pair[0] = mean + r * c;
            if let Some(x) = pair.get_mut(1) {
                *x = mean + r * s;
            }
        }
    }
}
