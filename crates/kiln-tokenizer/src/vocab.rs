use std::collections::BTreeSet;

use kiln_gguf::{Array, Gguf, Scalars, Value};

use crate::pieces::{Inserted, Pieces, Vocab, VocabError};
use crate::special::SpecialMatcher;
use crate::TokenizerError;

/// Which algorithm the GGUF asked for (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenizerKind {
    /// `"llama"`: SentencePiece BPE merging by score (Gemma 2/3).
    Spm,
    /// `"gemma4"`: BPE merging by rank over `tokenizer.ggml.merges`.
    Gemma4,
}

/// The token type stored in `tokenizer.ggml.token_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    Undefined,
    Normal,
    Unknown,
    Control,
    UserDefined,
    Unused,
    Byte,
}

impl TokenType {
    fn from_gguf(v: i64) -> TokenType {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Effective token attributes (llama.cpp's `llama_token_attr` bits): the
/// GGUF type, plus the overrides applied at load (e.g. end-of-generation
/// tokens forced to control). The six bits used fit a byte, which is how
/// a tokenizer stores them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct TokenAttr(pub u32);

impl TokenAttr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;

    pub fn has(self, bits: u32) -> bool {
        self.0 & bits != 0
    }
    pub fn is_control(self) -> bool {
        self.has(Self::CONTROL)
    }
    pub fn is_user_defined(self) -> bool {
        self.has(Self::USER_DEFINED)
    }
    pub fn is_byte(self) -> bool {
        self.has(Self::BYTE)
    }
    pub fn is_normal(self) -> bool {
        self.has(Self::NORMAL)
    }
    pub fn is_unknown(self) -> bool {
        self.has(Self::UNKNOWN)
    }
    pub fn is_unused(self) -> bool {
        self.has(Self::UNUSED)
    }

    fn from_type(t: TokenType) -> TokenAttr {
        TokenAttr(match t {
            TokenType::Undefined => 0,
            TokenType::Normal => Self::NORMAL,
            TokenType::Unknown => Self::UNKNOWN,
            TokenType::Control => Self::CONTROL,
            TokenType::UserDefined => Self::USER_DEFINED,
            TokenType::Unused => Self::UNUSED,
            TokenType::Byte => Self::BYTE,
        })
    }
}

/// A Gemma tokenizer built from GGUF metadata. Immutable and `Sync`:
/// share one between threads.
#[derive(Debug)]
pub struct Tokenizer {
    pub(crate) kind: TokenizerKind,
    /// Token texts by id, indexed by text (valid UTF-8, unique).
    pub(crate) vocab: Vocab,
    /// One per token (the GGUF's own array when it holds f32s).
    pub(crate) scores: Scalars<f32>,
    /// `tokenizer.ggml.token_type` (None: absent, every token normal).
    pub(crate) types: Option<Scalars<i32>>,
    /// Each token's [`TokenAttr`] bits, a byte each.
    pub(crate) attrs: Vec<u8>,
    /// Gemma 4 merges: key = `len(left) as u32 LE ++ left ++ right`, its
    /// rank in `merge_ranks` by key id.
    pub(crate) merges: Pieces,
    pub(crate) merge_ranks: Vec<u32>,
    /// Byte-fallback token for each byte value, if the vocabulary has one.
    pub(crate) byte_tokens: [Option<u32>; 256],
    pub(crate) special: SpecialMatcher,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) mask: Option<u32>,
    pub(crate) eog: BTreeSet<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_space_prefix: bool,
    /// llama.cpp's detokenizer post-pass (" ." → "." etc.); on for BPE
    /// vocabularies including Gemma 4, off for SentencePiece.
    pub(crate) clean_spaces: bool,
}

// Names llama.cpp recognises by text (llama_vocab::impl::load). Each list
// is checked in order of increasing id here; llama.cpp walks an unordered
// map, which only matters if a vocabulary holds two names of one list.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
/// Tokens that end generation by name. Includes `</s>` (added for
/// PaddleOCR), which is why llama.cpp forces Gemma 3's normal token 212
/// `</s>` to CONTROL: it is then only matched in text with
/// `parse_special`, and renders as nothing without `special`.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];
/// gpt-oss tokens llama.cpp always renders (made USER_DEFINED).
const ALWAYS_RENDER_NAMES: &[&str] = &["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"];

fn opt_bool(g: &Gguf, key: &str) -> Option<bool> {
    g.get(key).and_then(Value::as_bool)
}

impl Tokenizer {
    /// Build the tokenizer described by a GGUF file's `tokenizer.ggml.*`
    /// metadata. Token texts (and f32 scores) are shared with the file, not
    /// copied: the tokenizer keeps its bytes alive.
    pub fn from_gguf(g: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let model = g.get_str("tokenizer.ggml.model")?;
        let kind = match model {
            "llama" => TokenizerKind::Spm,
            "gemma4" => TokenizerKind::Gemma4,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };

        let raw_texts = g.get_str_array("tokenizer.ggml.tokens")?;
        let n = raw_texts.len();
        if n == 0 || n > i32::MAX as usize {
            return Err(TokenizerError::Invalid(format!("vocabulary size {n}")));
        }
        // Shared with the GGUF when stored as f32 (no copy), else converted.
        let mut scores: Scalars<f32> = match g.get("tokenizer.ggml.scores") {
            None => vec![0.0; n].into(),
            Some(Value::Array(Array::F32(s))) => s.clone(),
            Some(_) => g.get_f32_array("tokenizer.ggml.scores")?.into(),
        };
        if scores.len() < n {
            return Err(TokenizerError::Invalid(format!(
                "{} scores for {n} tokens",
                scores.len()
            )));
        }
        scores.truncate(n);
        // As the GGUF stores them (shared when i32, as llama.cpp writes
        // them); a value outside i32 is no known type either way.
        let types: Option<Scalars<i32>> = match g.get("tokenizer.ggml.token_type") {
            None => None,
            Some(Value::Array(Array::I32(t))) => Some(t.clone()),
            Some(_) => Some(
                g.get_i64_array("tokenizer.ggml.token_type")?
                    .into_iter()
                    .map(|t| i32::try_from(t).unwrap_or(0))
                    .collect::<Vec<i32>>()
                    .into(),
            ),
        };
        let types = types.map(|mut t| {
            t.truncate(n);
            t
        });
        let type_of = |id: usize| match &types {
            None => TokenType::Normal,
            Some(t) => TokenType::from_gguf(t.get(id).unwrap_or(0).into()),
        };
        if let Some(t) = types.as_ref().filter(|t| t.len() < n) {
            return Err(TokenizerError::Invalid(format!(
                "{} token types for {n} tokens",
                t.len()
            )));
        }

        let vocab = Vocab::new(raw_texts.clone()).map_err(|e| {
            TokenizerError::Invalid(match e {
                VocabError::Duplicate(t) => format!("duplicate token {t:?}"),
                VocabError::TooLarge => format!("vocabulary of {n} tokens too large"),
            })
        })?;
        let mut attrs: Vec<TokenAttr> =
            (0..n).map(|id| TokenAttr::from_type(type_of(id))).collect();

        let mut merges = Pieces::default();
        let mut merge_ranks = Vec::new();
        if kind == TokenizerKind::Gemma4 {
            let list = g.get_str_array("tokenizer.ggml.merges")?;
            // Each key is its merge's text plus a 4-byte length less the space.
            merges = Pieces::with_capacity(list.len(), list.text_len() + 3 * list.len());
            merge_ranks.reserve_exact(list.len());
            let mut key = Vec::new();
            for (rank, m) in list.iter().enumerate() {
                // Split at the first space after position 1 (a merge may
                // start with a literal space); entries without one are
                // ignored, and the first rank of a repeated pair wins.
                // Byte offsets: a merge may start with the 3-byte "▁".
                let m = m.as_bytes();
                let Some(pos) = m.iter().skip(1).position(|&b| b == b' ').map(|p| p + 1) else {
                    continue;
                };
                merge_key_into(&mut key, &m[..pos], &m[pos + 1..]);
                let added = merges
                    .insert(&key)
                    .map_err(|_| TokenizerError::Invalid("merge list above 4 GiB".into()))?;
                if let Inserted::New(_) = added {
                    merge_ranks.push(rank as u32);
                }
            }
        }

        // Defaults, then the GGUF keys (an id outside the vocabulary keeps
        // the default, as llama.cpp does).
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let (mut bos, mut eos, mut unk) = match kind {
            TokenizerKind::Spm => (in_range(Some(1)), in_range(Some(2)), in_range(Some(0))),
            TokenizerKind::Gemma4 => (None, None, None),
        };
        let (mut eot, mut eom, mut pad, mut mask) = (None, None, None, None);
        let (mut fim_pre, mut fim_suf, mut fim_mid) = (None, None, None);
        let (mut fim_pad, mut fim_rep, mut fim_sep) = (None, None, None);
        {
            let read = |key: &str, slot: &mut Option<u32>| {
                if let Some(v) = g.get(key).and_then(Value::as_u64) {
                    if (v as usize) < n {
                        *slot = Some(v as u32);
                    }
                }
            };
            read("tokenizer.ggml.bos_token_id", &mut bos);
            read("tokenizer.ggml.eos_token_id", &mut eos);
            read("tokenizer.ggml.eot_token_id", &mut eot);
            read("tokenizer.ggml.eom_token_id", &mut eom);
            read("tokenizer.ggml.unknown_token_id", &mut unk);
            read("tokenizer.ggml.padding_token_id", &mut pad);
            read("tokenizer.ggml.mask_token_id", &mut mask);
            read("tokenizer.ggml.fim_pre_token_id", &mut fim_pre);
            read("tokenizer.ggml.fim_suf_token_id", &mut fim_suf);
            read("tokenizer.ggml.fim_mid_token_id", &mut fim_mid);
            read("tokenizer.ggml.fim_pad_token_id", &mut fim_pad);
            read("tokenizer.ggml.fim_rep_token_id", &mut fim_rep);
            read("tokenizer.ggml.fim_sep_token_id", &mut fim_sep);
            read("tokenizer.ggml.prefix_token_id", &mut fim_pre);
            read("tokenizer.ggml.suffix_token_id", &mut fim_suf);
            read("tokenizer.ggml.middle_token_id", &mut fim_mid);
        }

        let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces) = match kind {
            TokenizerKind::Spm => (true, false, true, false),
            TokenizerKind::Gemma4 => (false, false, false, true),
        };
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_space_prefix") {
            add_space_prefix = b;
        }
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_bos_token") {
            add_bos = b;
        }
        if let Some(b) = opt_bool(g, "tokenizer.ggml.add_eos_token") {
            add_eos = b;
        }
        // llama.cpp PR #21500: Gemma 4 always gets BOS, whatever the GGUF says.
        if kind == TokenizerKind::Gemma4 {
            add_bos = true;
        }
        if add_bos && bos.is_none() {
            return Err(TokenizerError::Invalid(
                "add_bos is set but there is no BOS token".into(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::Invalid(
                "add_eos is set but there is no EOS token".into(),
            ));
        }

        // Text-based detection of special tokens, in llama.cpp's order:
        // each found token also becomes CONTROL.
        let lookup = |name: &str| vocab.find(name.as_bytes());
        let make_control = |attrs: &mut Vec<TokenAttr>, id: u32| {
            attrs[id as usize].0 |= TokenAttr::CONTROL;
        };
        let detect = |slot: &mut Option<u32>, names: &[&str], attrs: &mut Vec<TokenAttr>| {
            if slot.is_some() {
                return;
            }
            let found = names.iter().filter_map(|s| lookup(s)).min();
            if let Some(id) = found {
                *slot = Some(id);
                make_control(attrs, id);
            }
        };
        detect(&mut eot, EOT_NAMES, &mut attrs);
        detect(&mut eom, EOM_NAMES, &mut attrs);
        detect(&mut fim_pre, FIM_PRE_NAMES, &mut attrs);
        detect(&mut fim_suf, FIM_SUF_NAMES, &mut attrs);
        detect(&mut fim_mid, FIM_MID_NAMES, &mut attrs);
        detect(&mut fim_pad, FIM_PAD_NAMES, &mut attrs);
        detect(&mut fim_rep, FIM_REP_NAMES, &mut attrs);
        detect(&mut fim_sep, FIM_SEP_NAMES, &mut attrs);

        for (id, a) in attrs.iter_mut().enumerate() {
            let text = vocab.get(id as u32).unwrap_or_default();
            if a.is_control() && text.windows(6).any(|w| w == b"unused") {
                a.0 |= TokenAttr::UNUSED;
            }
        }

        let mut eog = BTreeSet::new();
        eog.extend([fim_pad, fim_rep, fim_sep].into_iter().flatten());
        for name in EOG_NAMES {
            if let Some(id) = lookup(name) {
                eog.insert(id);
                make_control(&mut attrs, id);
            }
        }
        for name in ALWAYS_RENDER_NAMES {
            if let Some(id) = lookup(name) {
                attrs[id as usize] = TokenAttr(TokenAttr::USER_DEFINED);
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());

        let eog_text = |eog: &BTreeSet<u32>, name: &str| {
            eog.iter()
                .copied()
                .find(|&id| vocab.get(id) == Some(name.as_bytes()))
        };
        // o200k_harmony / solar-open: "<|end|>" is not end-of-generation.
        let has = |eog: &BTreeSet<u32>, name: &str| eog_text(eog, name).is_some();
        if (has(&eog, "<|return|>") && has(&eog, "<|call|>"))
            || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>"))
        {
            if let Some(end) = eog_text(&eog, "<|end|>") {
                eog.remove(&end);
                attrs[end as usize] = TokenAttr(TokenAttr::USER_DEFINED);
            }
        }
        // Gemma 4 has a normal "</s>": undo the PaddleOCR rule above.
        if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
            if let Some(s) = eog_text(&eog, "</s>") {
                eog.remove(&s);
                attrs[s as usize] = TokenAttr(TokenAttr::NORMAL);
            }
        }

        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = vocab.find(hex.as_bytes());
            // SentencePiece falls back to the byte itself as a token.
            if slot.is_none() && kind == TokenizerKind::Spm && b != 0 {
                *slot = vocab.find(&[b as u8]);
            }
        }

        let special = SpecialMatcher::new(&vocab, &attrs);

        Ok(Tokenizer {
            kind,
            vocab,
            scores,
            types,
            // Every attribute bit fits a byte (see `TokenAttr`).
            attrs: attrs.iter().map(|a| a.0 as u8).collect(),
            merges,
            merge_ranks,
            byte_tokens,
            special,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            mask,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
        })
    }

    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }

    /// Number of tokens in the vocabulary.
    pub fn n_vocab(&self) -> usize {
        self.vocab.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }
    /// End-of-turn token (`<end_of_turn>` for Gemma 2/3), from the GGUF or
    /// detected by name.
    pub fn eot_id(&self) -> Option<u32> {
        self.eot
    }
    pub fn eom_id(&self) -> Option<u32> {
        self.eom
    }
    pub fn unk_id(&self) -> Option<u32> {
        self.unk
    }
    pub fn pad_id(&self) -> Option<u32> {
        self.pad
    }
    pub fn mask_id(&self) -> Option<u32> {
        self.mask
    }

    /// The end-of-generation set, ascending (Gemma 3: `<eos>`,
    /// `<end_of_turn>`, `</s>`; Gemma 4: `<eos>`, `<|tool_response>`,
    /// `<turn|>`).
    pub fn eog_ids(&self) -> Vec<u32> {
        self.eog.iter().copied().collect()
    }

    /// Whether generation should stop at `id`.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    /// The type stored in the GGUF (before load-time overrides).
    pub fn token_type(&self, id: u32) -> Option<TokenType> {
        if id as usize >= self.n_vocab() {
            return None;
        }
        let t = self
            .types
            .as_ref()
            .map_or(1, |t| t.get(id as usize).unwrap_or(0));
        Some(TokenType::from_gguf(t.into()))
    }

    /// The effective attributes (after load-time overrides).
    pub fn token_attr(&self, id: u32) -> Option<TokenAttr> {
        self.attrs.get(id as usize).map(|&a| TokenAttr(a.into()))
    }

    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.scores.get(id as usize)
    }

    /// The vocabulary text of a token (with `▁` for spaces, `<0xXX>` for
    /// byte tokens).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        // Always UTF-8: every text was inserted from a `str`.
        std::str::from_utf8(self.vocab.get(id)?).ok()
    }

    /// The id whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.find(text.as_bytes())
    }

    pub(crate) fn lookup(&self, bytes: &[u8]) -> Option<u32> {
        self.vocab.find(bytes)
    }

    /// Tokenize `text` the way `llama_tokenize(text, add_special,
    /// parse_special)` does.
    ///
    /// - `add_special`: prepend BOS when the vocabulary's `add_bos` is set
    ///   (always for Gemma 4) and append EOS when `add_eos` is set.
    /// - `parse_special`: also recognise CONTROL and UNKNOWN tokens
    ///   (`<start_of_turn>`, `<bos>`, `<unk>`…) written in the text.
    ///   USER_DEFINED tokens are recognised either way.
    ///
    /// Any bytes are accepted. SentencePiece works on raw bytes (an invalid
    /// UTF-8 byte becomes its `<0xXX>` token); Gemma 4 first replaces each
    /// invalid byte with U+FFFD, as llama.cpp's pre-splitter does.
    pub fn encode(
        &self,
        text: impl AsRef<[u8]>,
        add_special: bool,
        parse_special: bool,
    ) -> Vec<u32> {
        let text = text.as_ref();
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        // SentencePiece: a raw fragment gets the space prefix only when it
        // comes first or right after a special token.
        let mut prev_special = true;
        for frag in self.special.partition(text, parse_special) {
            match frag {
                crate::special::Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                crate::special::Fragment::Text(s) => {
                    match self.kind {
                        TokenizerKind::Spm => crate::spm::encode(
                            self,
                            s,
                            self.add_space_prefix && prev_special,
                            &mut out,
                        ),
                        TokenizerKind::Gemma4 => crate::bpe::encode(self, s, &mut out),
                    }
                    prev_special = false;
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    /// Push the byte-fallback tokens of `bytes`. A byte without a token is
    /// dropped (llama.cpp throws there; no Gemma vocabulary lacks one).
    pub(crate) fn push_bytes(&self, bytes: &[u8], out: &mut Vec<u32>) {
        out.extend(bytes.iter().filter_map(|&b| self.byte_tokens[b as usize]));
    }

    pub(crate) fn merge_rank(&self, key: &[u8]) -> Option<u32> {
        self.merges.find(key).map(|i| self.merge_ranks[i as usize])
    }
}

/// Key of a merge pair: the left length first, so that ("ab","c") and
/// ("a","bc") differ.
pub(crate) fn merge_key_into(k: &mut Vec<u8>, left: &[u8], right: &[u8]) {
    k.clear();
    k.extend_from_slice(&(left.len() as u32).to_le_bytes());
    k.extend_from_slice(left);
    k.extend_from_slice(right);
}
