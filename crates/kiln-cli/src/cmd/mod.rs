//! One module per subcommand: each has an `Args` (clap) and a `run`.

pub mod bench;
pub mod chat;
pub mod common;
pub mod constraint;
pub mod detokenize;
pub mod inspect;
pub mod logits;
pub mod models;
pub mod perplexity;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;
