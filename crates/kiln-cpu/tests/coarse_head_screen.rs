//! The one-row greedy head through the coarse screen
//! (`kiln_kernels::CoarseRows`), forced on every ISA (by default it runs
//! only with AVX-512 VBMI), picks what the full logits give, step by step.
//! Its own test binary: the switch is read once per process.

mod common;

#[test]
fn forced_coarse_screen_matches_the_logits_argmax() {
    std::env::set_var("KILN_HEAD_SCREEN", "coarse");
    common::check_single_greedy_heads();
}
