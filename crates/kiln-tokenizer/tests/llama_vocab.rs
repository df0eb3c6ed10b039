//! llama.cpp's own tokenizer vectors (models/ggml-vocab-*.gguf.inp/.out).
//! tests/test-tokenizer-0.cpp tokenizes each case with
//! `common_tokenize(ctx, text, add_special = false, parse_special = false)`.

mod common;

use kiln_tokenizer::TokenizerKind;

fn check(name: &str, kind: TokenizerKind) -> usize {
    let tok = common::load(&kiln_testdata::llama_vocab(name));
    assert_eq!(tok.kind(), kind);
    let cases = common::llama_vocab_cases(
        &kiln_testdata::llama_vocab(&format!("{name}.inp")),
        &kiln_testdata::llama_vocab(&format!("{name}.out")),
    );
    let mut errs = Vec::new();
    for (input, want) in &cases {
        let got = tok.encode(input, false, false);
        if &got != want {
            errs.push(format!(
                "{:?}: {got:?} != {want:?}",
                String::from_utf8_lossy(input)
            ));
        }
    }
    eprintln!("{name}: {} cases, {} mismatches", cases.len(), errs.len());
    assert!(errs.is_empty(), "{}", errs.join("\n"));
    cases.len()
}

#[test]
fn gemma4_vocab_vectors() {
    assert_eq!(check("ggml-vocab-gemma-4.gguf", TokenizerKind::Gemma4), 46);
}

#[test]
fn llama_spm_vocab_vectors() {
    let n = check("ggml-vocab-llama-spm.gguf", TokenizerKind::Spm);
    assert!(n > 0);
}

#[test]
fn gemma4_vocab_facts() {
    let tok = common::load(&kiln_testdata::llama_vocab("ggml-vocab-gemma-4.gguf"));
    assert_eq!(tok.n_vocab(), 262_144);
    assert!(tok.add_bos());
    assert_eq!(tok.encode("Hello world", true, false), vec![2, 9259, 1902]);
    assert_eq!(tok.encode("\n\n", false, false), vec![108]);
    assert_eq!(tok.token_id("▁"), Some(236743));
    // EOG: <eos>, <|tool_response>, <turn|>; "</s>" is a normal token here.
    assert_eq!(tok.eog_ids(), vec![1, 50, 106]);
    if let Some(s) = tok.token_id("</s>") {
        assert!(!tok.is_eog(s) && !tok.token_attr(s).unwrap().is_control());
    }
    // USER_DEFINED tokens are matched even without parse_special.
    let ud = "<|\"|>";
    assert_eq!(tok.encode(ud, false, false), vec![52]);
    // Chat prompt from GEMMA.md §2.3.
    let chat = "<|turn>user\nWhat is the capital of France?<turn|>\n<|turn>model\n";
    assert_eq!(
        tok.encode(chat, true, true),
        vec![2, 105, 2364, 107, 3689, 563, 506, 5279, 529, 7001, 236881, 106, 107, 105, 4368, 107]
    );
}
