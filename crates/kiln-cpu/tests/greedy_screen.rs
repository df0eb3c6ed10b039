//! The greedy heads (integer screen + exact re-score on Q8_0 where it
//! pays, else the logits scanned) pick the same token as the argmax of the
//! full logits, step by step, on every ISA; `batch_head_screen.rs` forces
//! the screens.

mod common;

use common::*;

#[test]
fn q8_0_greedy_tokens_match_logits_argmax_on_every_isa() {
    check_single_greedy_heads();
}

/// A batch's greedy heads pick what each sequence's own logits give, on
/// every ISA (by default: the screen where VNNI makes it pay, the logits
/// elsewhere; `batch_head_screen.rs` forces the screen).
#[test]
fn batched_greedy_heads_match_each_sequences_logits() {
    check_batched_greedy_heads();
}
