//! The real hyper-parameters of every supported Gemma text model
//! (shared/docs/GEMMA.md §1.3), in the form the planner needs.

use kiln_model::Arch;

/// One model's shapes. Per-layer values (sliding, FFN width, head size) are
/// resolved by the methods so the planner never branches on the model.
#[derive(Clone, Debug, PartialEq)]
pub struct Preset {
    pub arch: Arch,
    /// Lower-case size label as users type it: "270m", "e2b", ...
    pub size: &'static str,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    /// Head size of the sliding layers (all layers for Gemma 2/3).
    pub head_dim: usize,
    /// Head size of the global layers (Gemma 4: 512; otherwise = head_dim).
    pub head_dim_global: usize,
    pub ffn: usize,
    /// Gemma 4 E2B: KV-shared layers use a double-wide MLP.
    pub double_wide_shared_ffn: bool,
    pub window: usize,
    pub context: usize,
    pub n_vocab: usize,
    /// Gemma 3 4B+: linear RoPE scaling on global layers.
    pub rope_scale: Option<f32>,
    /// Gemma 4: a global layer every `global_every` layers (`il % n == n-1`).
    pub global_every: usize,
    /// Gemma 4 E models: trailing layers that reuse earlier K/V.
    pub shared_kv_layers: usize,
    /// Gemma 4 E models: per-layer-embedding width.
    pub ple_dim: usize,
}

const fn g2(
    size: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_kv: usize,
    ffn: usize,
) -> Preset {
    Preset {
        arch: Arch::Gemma2,
        size,
        n_layer,
        n_embd,
        n_head,
        n_kv_head: n_kv,
        head_dim: 256,
        head_dim_global: 256,
        ffn,
        double_wide_shared_ffn: false,
        window: 4096,
        context: 8192,
        n_vocab: 256_000,
        rope_scale: None,
        global_every: 2,
        shared_kv_layers: 0,
        ple_dim: 0,
    }
}

// Positional constructors keep PRESETS one readable row per model.
#[allow(clippy::too_many_arguments)]
const fn g3(
    size: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_head: usize,
    n_kv: usize,
    head_dim: usize,
    ffn: usize,
    window: usize,
    context: usize,
    rope_scale: Option<f32>,
) -> Preset {
    Preset {
        arch: Arch::Gemma3,
        size,
        n_layer,
        n_embd,
        n_head,
        n_kv_head: n_kv,
        head_dim,
        head_dim_global: head_dim,
        ffn,
        double_wide_shared_ffn: false,
        window,
        context,
        n_vocab: 262_144,
        rope_scale,
        global_every: 6,
        shared_kv_layers: 0,
        ple_dim: 0,
    }
}

#[allow(clippy::too_many_arguments)]
const fn g4e(
    size: &'static str,
    n_layer: usize,
    n_embd: usize,
    n_kv: usize,
    ffn: usize,
    double: bool,
    every: usize,
    shared: usize,
) -> Preset {
    Preset {
        arch: Arch::Gemma4,
        size,
        n_layer,
        n_embd,
        n_head: 8,
        n_kv_head: n_kv,
        head_dim: 256,
        head_dim_global: 512,
        ffn,
        double_wide_shared_ffn: double,
        window: 512,
        context: 131_072,
        n_vocab: 262_144,
        rope_scale: None,
        global_every: every,
        shared_kv_layers: shared,
        ple_dim: 256,
    }
}

/// Every model `synthesize` can produce.
pub const PRESETS: &[Preset] = &[
    g2("2b", 26, 2304, 8, 4, 9216),
    g2("9b", 42, 3584, 16, 8, 14336),
    g3("270m", 18, 640, 4, 1, 256, 2048, 512, 32_768, None),
    g3("1b", 26, 1152, 4, 1, 256, 6912, 512, 32_768, None),
    g3("4b", 34, 2560, 8, 4, 256, 10240, 1024, 131_072, Some(8.0)),
    g3("12b", 48, 3840, 16, 8, 256, 15360, 1024, 131_072, Some(8.0)),
    g3(
        "27b",
        62,
        5376,
        32,
        16,
        128,
        21504,
        1024,
        131_072,
        Some(8.0),
    ),
    g4e("e2b", 35, 1536, 1, 6144, true, 5, 20),
    g4e("e4b", 42, 2560, 2, 10240, false, 6, 18),
];

impl Preset {
    /// The preset for `arch` and `size` (case-insensitive, e.g. "270M").
    pub fn find(arch: Arch, size: &str) -> Option<&'static Preset> {
        PRESETS
            .iter()
            .find(|p| p.arch == arch && p.size.eq_ignore_ascii_case(size))
    }

    /// Sliding (local) attention on layer `il`, as llama.cpp assigns it.
    pub fn is_sliding(&self, il: usize) -> bool {
        il % self.global_every < self.global_every - 1
    }

    /// First KV-shared layer (= n_layer when none are shared).
    pub fn first_shared_layer(&self) -> usize {
        self.n_layer - self.shared_kv_layers
    }

    pub fn layer_ffn(&self, il: usize) -> usize {
        if self.double_wide_shared_ffn && il >= self.first_shared_layer() {
            2 * self.ffn
        } else {
            self.ffn
        }
    }

    pub fn layer_head_dim(&self, il: usize) -> usize {
        if self.is_sliding(il) {
            self.head_dim
        } else {
            self.head_dim_global
        }
    }

    /// "gemma3-270m": the name used in file names and reports.
    pub fn label(&self) -> String {
        format!("{}-{}", self.arch.gguf_name(), self.size)
    }
}
