//! Ids back to bytes (llama.cpp's `llama_token_to_piece` and
//! `llama_detokenize`), and a streaming UTF-8 decoder.

use std::borrow::Cow;

use crate::spm::ESCAPED_SPACE;
use crate::vocab::TokenAttr;
use crate::{Tokenizer, TokenizerError};

/// Options of [`Tokenizer::decode`], as in `llama_detokenize`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Drop a leading BOS (when the vocabulary adds BOS) and a trailing EOS
    /// (when it adds EOS).
    pub remove_special: bool,
    /// Render CONTROL and UNKNOWN tokens as their text (`<end_of_turn>`);
    /// otherwise they render as nothing. USER_DEFINED tokens always render.
    pub unparse_special: bool,
}

impl Tokenizer {
    fn check_id(&self, id: u32) -> Result<usize, TokenizerError> {
        let i = id as usize;
        if i < self.vocab.len() {
            Ok(i)
        } else {
            Err(TokenizerError::IdOutOfRange {
                id,
                n_vocab: self.vocab.len(),
            })
        }
    }

    /// The bytes a token stands for (`llama_token_to_piece` with
    /// `lstrip = 0`). With `special = false`, CONTROL and UNKNOWN tokens
    /// give nothing. UNUSED and undefined-type tokens always give nothing.
    /// A byte token can be half a UTF-8 character, hence bytes.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Result<Cow<'_, [u8]>, TokenizerError> {
        let i = self.check_id(id)?;
        let attr = TokenAttr(self.attrs[i].into());
        let text = self.vocab.get(id).unwrap_or_default();
        let specials = TokenAttr::UNKNOWN | TokenAttr::CONTROL;
        if attr.has(specials) {
            return Ok(if special {
                Cow::Borrowed(text)
            } else {
                Cow::Borrowed(&[])
            });
        }
        if attr.is_user_defined() {
            return Ok(Cow::Borrowed(text));
        }
        if attr.is_normal() {
            return Ok(unescape_spaces(text));
        }
        if attr.is_byte() {
            return Ok(Cow::Owned(vec![byte_token_value(text)]));
        }
        Ok(Cow::Borrowed(&[]))
    }

    /// Ids to bytes, as `llama_detokenize(remove_special, unparse_special)`
    /// does: with `add_space_prefix` the first piece loses one leading
    /// space (unless a BOS was removed before it), and Gemma 4 gets
    /// llama.cpp's BPE clean-up pass (`" ."` → `"."`, `" 's"` → `"'s"`,
    /// …), which Hugging Face does not apply.
    pub fn decode(&self, ids: &[u32], opts: DecodeOptions) -> Result<Vec<u8>, TokenizerError> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if opts.remove_special && self.add_bos && ids.first().is_some_and(|&f| Some(f) == self.bos)
        {
            remove_space = false;
            ids = &ids[1..];
        }
        if opts.remove_special && self.add_eos && ids.last().is_some_and(|&l| Some(l) == self.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut out = Vec::new();
        for &id in ids {
            let piece = self.token_to_piece(id, opts.unparse_special)?;
            let piece: &[u8] = if remove_space {
                piece.strip_prefix(b" ").unwrap_or(&piece)
            } else {
                &piece
            };
            out.extend_from_slice(piece);
            remove_space = false;
        }
        if self.clean_spaces {
            clean_spaces(&mut out);
        }
        Ok(out)
    }

    /// [`decode`](Self::decode) into a `String`, invalid UTF-8 replaced by
    /// U+FFFD.
    pub fn decode_lossy(&self, ids: &[u32], opts: DecodeOptions) -> Result<String, TokenizerError> {
        Ok(String::from_utf8_lossy(&self.decode(ids, opts)?).into_owned())
    }
}

fn unescape_spaces(text: &[u8]) -> Cow<'_, [u8]> {
    if !text
        .windows(ESCAPED_SPACE.len())
        .any(|w| w == ESCAPED_SPACE)
    {
        return Cow::Borrowed(text);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(ESCAPED_SPACE) {
            out.push(b' ');
            i += ESCAPED_SPACE.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    Cow::Owned(out)
}

/// The byte of a `<0xXX>` token, parsed like llama.cpp's
/// `strtol(text.substr(3, 2), 16)`: leading hex digits, 0 if none.
fn byte_token_value(text: &[u8]) -> u8 {
    let digits = text.get(3..).unwrap_or(&[]);
    let mut v = 0u8;
    for &c in digits.iter().take(2) {
        match (c as char).to_digit(16) {
            Some(d) => v = v * 16 + d as u8,
            None => break,
        }
    }
    v
}

/// llama.cpp's `clean_spaces` passes over the detokenized bytes, in place.
fn clean_spaces(text: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ," lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);

    // Pass 2: " ' " becomes "'". The dropped space is zeroed so that the
    // next character does not see a space before it.
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);

    // Pass 3: " 's", " 'm", " 're", " 've" lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let x2 = text.get(i + 2).copied().filter(|_| i + 2 < n);
            let drop = matches!(x1, b's' | b'm')
                || (!matches!(x1, b't' | b'd')
                    && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if drop {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Decodes ids one at a time into text, never splitting a UTF-8 character:
/// bytes of an incomplete character wait for the next token, and
/// [`finish`](Self::finish) flushes whatever is left. Invalid bytes become
/// U+FFFD.
///
/// The output joined equals `decode(ids, remove_special = false,
/// unparse_special = special)` for SentencePiece vocabularies (lossily
/// converted); Gemma 4's `clean_spaces` pass needs look-ahead and is not
/// applied, like llama.cpp's own per-token streaming.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tok: &'a Tokenizer,
    special: bool,
    first: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    /// `special`: render CONTROL/UNKNOWN tokens as text.
    pub fn new(tok: &'a Tokenizer, special: bool) -> StreamDecoder<'a> {
        StreamDecoder {
            tok,
            special,
            first: true,
            pending: Vec::new(),
        }
    }

    /// Feed one id; returns the text that is now complete (maybe empty).
    /// An out-of-range id is an error and leaves the decoder unchanged.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self.tok.token_to_piece(id, self.special)?;
        let piece: &[u8] = if self.first && self.tok.add_space_prefix {
            piece.strip_prefix(b" ").unwrap_or(&piece)
        } else {
            &piece
        };
        self.first = false;
        self.pending.extend_from_slice(piece);
        Ok(self.take_complete())
    }

    /// Flush the remaining bytes (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // Only valid UTF-8 was split off.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_spaces_matches_llama_cpp_passes() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(
            clean("it 's I 'm we 're they 've"),
            "it's I'm we're they've"
        );
        assert_eq!(clean("don 't I 'd you 'll"), "don 't I 'd you 'll");
        assert_eq!(clean(""), "");
        assert_eq!(clean(" "), " ");
    }

    #[test]
    fn byte_token_value_is_strtol_like() {
        assert_eq!(byte_token_value(b"<0x41>"), 0x41);
        assert_eq!(byte_token_value(b"<0xZZ>"), 0);
        assert_eq!(byte_token_value(b"<0x"), 0);
        assert_eq!(byte_token_value(b""), 0);
    }
}
