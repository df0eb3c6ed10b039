//! Kiln's tokenizer as llguidance sees it: every token id's bytes in a
//! [`TokTrie`], end-of-generation ids as the trie's EOS set.
//!
//! - Normal and byte tokens: the bytes they decode to (`▁` → space, `<0x41>`
//!   → `A`), exactly what the streamed text shows.
//! - USER_DEFINED tokens (Gemma 4's `<|"|>`, `<|tool_call>`, `<|channel>`):
//!   their text. They are matched in text by the tokenizer and rendered in
//!   output (GEMMA.md §2.2), so a grammar literal `"<|tool_call>"` allows
//!   the single token as well as the same bytes spelled by smaller tokens.
//! - CONTROL and UNKNOWN tokens (`<eos>`, `<start_of_turn>`, `<|turn>`):
//!   llguidance's special-token marker byte 0xFF before their text, so no
//!   text grammar can produce them; a Lark grammar names them as
//!   `<start_of_turn>`. End-of-generation ids are allowed where the
//!   grammar may end.
//! - UNUSED tokens: no bytes, never allowed.

use std::sync::Arc;

use kiln_tokenizer::Tokenizer;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::error::{Result, RuntimeError};

/// The llguidance tokenizer environment over a Kiln [`Tokenizer`].
pub(crate) struct KilnTokEnv {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for KilnTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Used by llguidance only for text it forces; USER_DEFINED tokens
    /// are recognised, control tokens are not (they carry the marker).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tok.encode(s, false, false)
    }
}

/// The bytes token `id` stands for in the trie (see the module docs).
pub(crate) fn token_bytes(tok: &Tokenizer, id: u32) -> Vec<u8> {
    let Some(attr) = tok.token_attr(id) else {
        return Vec::new();
    };
    if attr.is_control() || attr.is_unknown() {
        let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        b.extend_from_slice(tok.token_text(id).unwrap_or_default().as_bytes());
        return b;
    }
    tok.token_to_piece(id, false)
        .map(|p| p.into_owned())
        .unwrap_or_default()
}

/// Builds the environment; `eog` must be non-empty and in the vocabulary.
pub(crate) fn tok_env(tok: Arc<Tokenizer>, eog: &[u32]) -> Result<TokEnv> {
    let n = tok.n_vocab();
    let bad = |reason: String| RuntimeError::InvalidConstraint {
        kind: "vocabulary",
        reason,
    };
    let vocab_size = u32::try_from(n).map_err(|_| bad(format!("{n} tokens is too many")))?;
    let Some(&first_eog) = eog.first() else {
        return Err(bad(
            "the model has no end-of-generation token, so no constraint can end".into(),
        ));
    };
    if let Some(&id) = eog.iter().find(|&&id| id >= vocab_size) {
        return Err(bad(format!("end-of-generation id {id} is out of range")));
    }
    let words: Vec<Vec<u8>> = (0..vocab_size).map(|id| token_bytes(&tok, id)).collect();
    let mut info = TokRxInfo::new(vocab_size, first_eog);
    info.tok_bos = tok.bos_id();
    info.tok_pad = tok.pad_id();
    info.tok_unk = tok.unk_id();
    info.tok_end_of_turn = tok.eot_id();
    let trie = TokTrie::from(&info, &words).with_eos_tokens(eog);
    Ok(Arc::new(KilnTokEnv { trie, tok }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Arc<Tokenizer> {
        let g = kiln_gguf::Gguf::open(kiln_testdata::fixture(&format!("{name}/model-f32.gguf")))
            .unwrap();
        Arc::new(Tokenizer::from_gguf(&g).unwrap())
    }

    #[test]
    fn control_tokens_carry_the_special_marker_and_text_tokens_their_bytes() {
        let tok = fixture("gemma3-tiny");
        let eot = tok.token_id("<end_of_turn>").unwrap();
        assert_eq!(token_bytes(&tok, eot), b"\xff<end_of_turn>");
        let hello = tok.encode("Hello", false, false);
        let bytes: Vec<u8> = hello.iter().flat_map(|&t| token_bytes(&tok, t)).collect();
        assert_eq!(bytes, b"Hello");
        let env = tok_env(tok.clone(), &tok.eog_ids()).unwrap();
        let trie = env.tok_trie();
        assert_eq!(trie.get_special_token("<end_of_turn>"), Some(eot));
        assert_eq!(trie.eos_tokens(), tok.eog_ids().as_slice());
        assert!(tok_env(tok, &[]).is_err());
    }
}
