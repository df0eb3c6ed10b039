//! Linear time on long lines, no panics on arbitrary input, decoding and
//! streaming.

mod common;

use std::time::{Duration, Instant};

use kiln_tokenizer::{DecodeOptions, StreamDecoder, Tokenizer};

fn gemma3() -> Tokenizer {
    common::load(&kiln_testdata::real_model())
}

fn gemma4() -> Tokenizer {
    common::load(&kiln_testdata::llama_vocab("ggml-vocab-gemma-4.gguf"))
}

/// Deterministic pseudo-random bytes (xorshift).
fn noise(n: usize, mut s: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

fn lines_200k() -> Vec<(&'static str, Vec<u8>)> {
    let n = 200_000;
    let alnum: Vec<u8> = noise(n, 7)
        .iter()
        .map(|b| b"abcdefghijklmnopqrstuvwxyz0123456789"[*b as usize % 36])
        .collect();
    vec![
        ("a repeated", vec![b'a'; n]),
        ("random alnum", alnum),
        ("CJK", "日本語".repeat(n / 3).into_bytes()),
        ("'<' repeated", vec![b'<'; n]),
        ("'<unused' repeated", "<unused".repeat(n / 7).into_bytes()),
    ]
}

fn assert_fast(tok: &Tokenizer, which: &str) {
    let dec = DecodeOptions {
        remove_special: false,
        unparse_special: true,
    };
    for (name, line) in lines_200k() {
        let t = Instant::now();
        let ids = tok.encode(&line, false, true);
        let took = t.elapsed();
        assert!(
            took < Duration::from_secs(3),
            "{which} {name}: {} bytes took {took:?}",
            line.len()
        );
        eprintln!(
            "{which} {name}: {} bytes -> {} ids in {took:?}",
            line.len(),
            ids.len()
        );
        // Every byte is accounted for: decoding gives the input back.
        assert!(
            tok.decode(&ids, dec).unwrap() == line,
            "{which} {name}: round trip differs"
        );
    }
}

#[test]
fn long_line_is_fast_spm() {
    assert_fast(&gemma3(), "gemma3");
}

#[test]
fn long_line_is_fast_gemma4() {
    assert_fast(&gemma4(), "gemma4");
}

#[test]
fn arbitrary_bytes_never_panic_and_round_trip() {
    let raw = DecodeOptions {
        remove_special: false,
        unparse_special: true,
    };
    for tok in [gemma3(), gemma4()] {
        for seed in 1..40u64 {
            // No spaces and no 0xE2: a space is escaped to "▁" before the
            // split, so after a dangling lead byte its bytes land in byte
            // tokens and decode as "▁" (as in llama.cpp), not as a space.
            let bytes: Vec<u8> = noise(2000 + seed as usize * 13, seed)
                .into_iter()
                .map(|b| match b {
                    0xE2 | b' ' => b + 1,
                    b => b,
                })
                .collect();
            for (add, parse) in [(false, false), (true, true)] {
                let ids = tok.encode(&bytes, add, parse);
                assert!(ids.iter().all(|&id| (id as usize) < tok.n_vocab()));
                let back = tok.decode(&ids, raw).unwrap();
                if tok.kind() == kiln_tokenizer::TokenizerKind::Spm {
                    // SentencePiece keeps raw bytes: an exact round trip.
                    let body = if add {
                        &back[b"<bos>".len()..]
                    } else {
                        &back[..]
                    };
                    let want = &bytes[..];
                    let at = body.iter().zip(want).position(|(a, b)| a != b);
                    assert!(
                        body == want,
                        "seed {seed}: round trip differs at {at:?}: {:?} vs {:?}",
                        at.map(|i| &body[i.saturating_sub(4)..(i + 8).min(body.len())]),
                        at.map(|i| &want[i.saturating_sub(4)..(i + 8).min(want.len())])
                    );
                } else {
                    // Gemma 4 replaces undecodable bytes with U+FFFD first
                    // (surrogates pass through and overlong forms such as
                    // C1 81 become ASCII, as in llama.cpp), so every ASCII
                    // byte of the input survives and a few may be added.
                    let ascii = |v: &[u8]| v.iter().filter(|b| b.is_ascii()).count();
                    let extra = if add { b"<bos>".len() } else { 0 };
                    assert!(ascii(&back) >= ascii(&bytes) + extra, "seed {seed}");
                }
            }
        }
        assert_eq!(tok.encode(b"", false, true), Vec::<u32>::new());
        assert_eq!(tok.encode(b"", true, true), vec![2]);
        let n = tok.n_vocab() as u32;
        assert!(tok.decode(&[n], raw).is_err());
        assert!(tok.decode(&[u32::MAX], raw).is_err());
        assert!(tok.token_to_piece(n, false).is_err());
        assert_eq!(tok.token_attr(n), None);
        assert_eq!(tok.token_text(n), None);
    }
}

#[test]
fn gemma4_invalid_utf8_becomes_replacement_char() {
    let tok = gemma4();
    // llama.cpp's pre-splitter decodes code points and turns each bad byte
    // into U+FFFD before BPE.
    assert_eq!(
        tok.encode(b"abc\x80def", false, false),
        tok.encode("abc\u{FFFD}def", false, false)
    );
    assert_eq!(
        tok.encode(b"\xF5\x80\x80\x80", false, false),
        tok.encode("\u{FFFD}", false, false)
    );
}

#[test]
fn stream_decoder_never_splits_characters() {
    let tok = gemma3();
    let text = "héllo 日本語 🦀🚀 a\u{200b}b <end_of_turn> done";
    // Byte tokens only, to force characters across several ids.
    let mut ids = Vec::new();
    for b in text.bytes() {
        ids.push(tok.token_id(&format!("<0x{b:02X}>")).unwrap());
    }
    ids.extend(tok.encode(text, false, true));
    for special in [false, true] {
        let mut s = StreamDecoder::new(&tok, special);
        let mut out = String::new();
        for &id in &ids {
            let chunk = s.push(id).unwrap();
            out.push_str(&chunk);
        }
        out.push_str(&s.finish());
        let opts = DecodeOptions {
            remove_special: false,
            unparse_special: special,
        };
        assert_eq!(out, tok.decode_lossy(&ids, opts).unwrap());
    }
    // A dangling lead byte waits, then flushes as U+FFFD.
    let mut s = StreamDecoder::new(&tok, true);
    assert_eq!(s.push(tok.token_id("<0xE6>").unwrap()).unwrap(), "");
    assert!(s.push(tok.n_vocab() as u32).is_err());
    assert_eq!(s.push(tok.token_id("<0x97>").unwrap()).unwrap(), "");
    assert_eq!(s.finish(), "\u{FFFD}");
    // An invalid byte is replaced at once.
    assert_eq!(s.push(tok.token_id("<0xFF>").unwrap()).unwrap(), "\u{FFFD}");
}

#[test]
fn longest_special_token_wins_like_llama_cpp() {
    let tok = gemma3();
    // "<start_of_turn>" contains no shorter special token, but the split
    // is by length: the long token is taken first, then the rest.
    let ids = tok.encode("<start_of_turn><end_of_turn><eos>", false, true);
    assert_eq!(ids, vec![105, 106, 1]);
    // A partial special token is plain text.
    assert!(!tok.encode("<start_of_turn", false, true).contains(&105));
}
