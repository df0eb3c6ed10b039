//! One module per subcommand: each has an `Args` (clap) and a `run`.

pub mod detokenize;
pub mod inspect;
pub mod tokenize;
