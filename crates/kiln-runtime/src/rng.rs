//! The seeded PRNG of sampling, shared with the model crate (whose
//! sampling head draws from the same stream: `kiln_model::Rng`).

pub use kiln_model::Rng;
