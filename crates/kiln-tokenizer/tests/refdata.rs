//! llama.cpp's ids, pieces and detokenized round trips for the real
//! Gemma 3 270M vocabulary (shared/refdata/tokenize.json).

mod common;

use kiln_tokenizer::{DecodeOptions, Tokenizer};

fn check_variant(tok: &Tokenizer, name: &str, input: &[u8], v: &serde_json::Value) -> Vec<String> {
    let mut errs = Vec::new();
    let add_bos = v["add_bos"].as_bool().unwrap();
    let parse_special = v["parse_special"].as_bool().unwrap();
    let want = common::ids(&v["ids"]);
    let got = tok.encode(input, add_bos, parse_special);
    let tag = format!("{name} add_bos={add_bos} parse_special={parse_special}");
    if got != want {
        errs.push(format!("{tag}: ids {got:?} != {want:?}"));
    }
    for (id, hex) in want.iter().zip(v["pieces_hex"].as_array().unwrap()) {
        let piece = tok.token_to_piece(*id, true).unwrap();
        if *piece != common::unhex(hex.as_str().unwrap())[..] {
            errs.push(format!("{tag}: piece of {id} = {piece:?}"));
        }
    }
    for (key, opts) in [
        (
            "detok_unparse_special",
            DecodeOptions {
                remove_special: false,
                unparse_special: true,
            },
        ),
        (
            "detok_remove_special",
            DecodeOptions {
                remove_special: true,
                unparse_special: false,
            },
        ),
    ] {
        let want = common::unhex(v[key]["hex"].as_str().unwrap());
        let got = tok.decode(&common::ids(&v["ids"]), opts).unwrap();
        if got != want {
            errs.push(format!(
                "{tag}: {key} {:?} != {:?}",
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want)
            ));
        }
    }
    errs
}

#[test]
fn refdata_tokenize_matches_llama_cpp() {
    let tok = common::load(&kiln_testdata::real_model());
    let data = common::json(&kiln_testdata::refdata("tokenize.json"));
    let entries = data["entries"].as_array().unwrap();
    let (mut n, mut errs) = (0, Vec::new());
    for e in entries {
        let name = e["name"].as_str().unwrap();
        let input = common::unhex(e["bytes_hex"].as_str().unwrap());
        for v in e["variants"].as_array().unwrap() {
            n += 1;
            errs.extend(check_variant(&tok, name, &input, v));
        }
    }
    eprintln!(
        "refdata: {n} variants of {} strings, {} mismatches",
        entries.len(),
        errs.len()
    );
    assert!(n >= 4 * entries.len() && !entries.is_empty());
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

#[test]
fn gemma3_vocab_facts() {
    let tok = common::load(&kiln_testdata::real_model());
    assert_eq!(tok.n_vocab(), 262_144);
    assert_eq!(
        (tok.bos_id(), tok.eos_id(), tok.unk_id(), tok.pad_id()),
        (Some(2), Some(1), Some(3), Some(0))
    );
    assert!(tok.add_bos() && !tok.add_eos() && !tok.add_space_prefix());
    assert_eq!(tok.eot_id(), Some(106));
    // llama.cpp: "EOG tokens: 1 <eos>, 106 <end_of_turn>, 212 </s>".
    assert_eq!(tok.eog_ids(), vec![1, 106, 212]);
    assert_eq!(tok.token_id("</s>"), Some(212));
    assert!(tok.token_attr(212).unwrap().is_control());
    assert_eq!(
        tok.token_type(212),
        Some(kiln_tokenizer::TokenType::UserDefined)
    );
    // USER_DEFINED in the GGUF (always matched), forced CONTROL by llama.cpp:
    // matched only with parse_special, rendered only with special.
    assert_eq!(tok.encode("</s>", false, true), vec![212]);
    assert_ne!(tok.encode("</s>", false, false), vec![212]);
    assert!(tok.token_to_piece(212, false).unwrap().is_empty());
    assert_eq!(&*tok.token_to_piece(212, true).unwrap(), b"</s>");
    assert_eq!(tok.token_text(107), Some("\n"));
    assert!(tok.token_to_piece(262_144, true).is_err());
}
