//! The one-row greedy head through the coarse screen
//! (`kiln_kernels::CoarseRows`), forced on every ISA (by default it runs
//! only with AVX-512 VBMI), picks what the full logits give, step by step.
//! Its own test binary: the switch is read once per process.

mod common;

use kiln_cpu::Isa;

#[test]
fn forced_coarse_screen_matches_the_logits_argmax() {
    std::env::set_var("KILN_HEAD_SCREEN", "coarse");
    // Every candidate set above 4 rows is narrowed (the fixtures' heads
    // are small).
    std::env::set_var("KILN_NARROW_MIN", "4");
    common::check_single_greedy_heads();
    flat_distributions_on_the_real_model();
}

/// The real 270M after a prompt of random tokens: a flat distribution,
/// where the coarse bounds leave thousands of candidates (91,734 of
/// 262,144 after 4,096 such tokens) for the Q8_0 screen of their rebuilt
/// rows to narrow before the exact re-scoring.
fn flat_distributions_on_the_real_model() {
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let prompt: Vec<u32> = (0..96)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 262_000) as u32
        })
        .collect();
    for isa in [Isa::Scalar, Isa::detect()] {
        let m = common::load_isa(&kiln_testdata::real_model(), isa);
        common::check_greedy_steps(&m, &prompt, 3, &format!("real 270M {isa}"));
    }
}
