//! The greedy heads' integer screens (one row and a batch), forced on
//! every ISA (by default they run only where VNNI makes them pay), pick
//! what each sequence's own logits give. Its own test binary: the switch is read
//! once per process.

mod common;

#[test]
fn forced_screen_matches_each_sequences_logits() {
    std::env::set_var("KILN_BATCH_HEAD", "screen");
    common::check_batched_greedy_heads();
    common::check_single_greedy_heads();
}
