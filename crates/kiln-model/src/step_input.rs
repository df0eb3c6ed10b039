//! A step's inputs as the host builds them ([`StepInput`]: every row's
//! token and position, each sequence's span) and the key that says when a
//! step may replay a captured graph ([`GraphKey`]).

/// The host side of one step's inputs: what changes between two steps of
/// the same shape. The model fills it; [`Backend::load_step`](crate::Backend::load_step) copies it
/// into the backend's [`Backend::Step`](crate::Backend::Step), which the ops read (on a GPU, one
/// small copy, so a captured graph replays with new positions).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct StepInput {
    /// Token id of every row.
    pub tokens: Vec<u32>,
    /// Position of every row.
    pub positions: Vec<u32>,
    /// The sequences, their rows laid end to end in order.
    pub seqs: Vec<SeqSpan>,
}

/// One sequence's rows in a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SeqSpan {
    /// First row of the sequence in the step.
    pub row0: usize,
    /// Rows (new tokens) of the sequence.
    pub n_rows: usize,
    /// Positions already in its KV cache; row `t` is at `p0 + t`.
    pub p0: usize,
}

impl Clone for StepInput {
    fn clone(&self) -> Self {
        StepInput {
            tokens: self.tokens.clone(),
            positions: self.positions.clone(),
            seqs: self.seqs.clone(),
        }
    }

    /// Reuses the allocations (a backend copies each step's input).
    fn clone_from(&mut self, src: &Self) {
        self.tokens.clone_from(&src.tokens);
        self.positions.clone_from(&src.positions);
        self.seqs.clone_from(&src.seqs);
    }
}

impl StepInput {
    /// Empties it, keeping the allocations.
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.positions.clear();
        self.seqs.clear();
    }

    /// Appends a sequence of `tokens` whose cache holds `p0` positions.
    pub fn push_seq(&mut self, tokens: &[u32], p0: usize) {
        let row0 = self.tokens.len();
        self.tokens.extend_from_slice(tokens);
        self.positions
            .extend((0..tokens.len()).map(|t| (p0 + t) as u32));
        self.seqs.push(SeqSpan {
            row0,
            n_rows: tokens.len(),
            p0,
        });
    }

    /// Rows in the step.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }
}

/// What identifies a replayable step: the same key means the same kernels
/// on the same buffers with the same launch shapes, so a backend may
/// replay a graph captured for it. Only the step's inputs may differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Rows of the step (a decode step's, padded to a power of two).
    pub rows: usize,
    /// KV length bucket (a power of two at least every sequence's
    /// `p0 + n_rows`); attention launch shapes are sized by it.
    pub kv_bucket: usize,
    /// Identity of the buffers the step's launches name (the scratch);
    /// changes whenever one is reallocated. Caches are not among them:
    /// the ops find them through the step ([`Backend::bind_kv`](crate::Backend::bind_kv)).
    pub buffers: u64,
    /// Whether the step's head samples ([`Backend::sample_head`](crate::Backend::sample_head)) rather
    /// than takes argmaxes.
    pub sampled: bool,
}
