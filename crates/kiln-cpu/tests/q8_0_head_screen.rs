//! The one-row greedy head through the Q8_0 screen, forced on every ISA
//! (where AVX-512 VBMI runs the coarse screen by default), picks what the
//! full logits give, step by step. Its own test binary: the switch is
//! read once per process.

mod common;

#[test]
fn forced_q8_0_screen_matches_the_logits_argmax() {
    std::env::set_var("KILN_HEAD_SCREEN", "q8_0");
    common::check_single_greedy_heads();
}
