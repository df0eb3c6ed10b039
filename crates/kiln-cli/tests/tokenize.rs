//! `kiln tokenize` / `detokenize` on the real model against llama.cpp's ids
//! (shared/refdata/tokenize.json), a few cases in all four flag variants.

mod common;

use common::{kiln, kiln_json, kiln_ok, TempDir};
use serde_json::Value;

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn entries() -> Vec<Value> {
    let text = std::fs::read_to_string(kiln_testdata::refdata("tokenize.json")).unwrap();
    let j: Value = serde_json::from_str(&text).unwrap();
    j["entries"].as_array().unwrap().clone()
}

#[test]
fn refdata_cases_match_llama_cpp() {
    let model = kiln_testdata::real_model();
    let model = model.to_str().unwrap();
    let dir = TempDir::new("tokenize");
    let names = [
        "en_hello",
        "multi_space",
        "emoji_mix",
        "gemma_chat",
        "lit_bos_hello",
        "nul_byte",
        "invalid_utf8_mid",
        "crlf",
    ];
    let all = entries();
    for name in names {
        let e = all
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("no case {name}"));
        // Files carry the exact bytes (NUL, invalid UTF-8, CR).
        let file = dir.0.join(name);
        std::fs::write(&file, hex(e["bytes_hex"].as_str().unwrap())).unwrap();
        for v in e["variants"].as_array().unwrap() {
            let mut args = vec![
                "tokenize",
                "-m",
                model,
                "--json",
                "--file",
                file.to_str().unwrap(),
            ];
            if v["add_bos"] == false {
                args.push("--no-bos");
            }
            if v["parse_special"] == true {
                args.push("--special");
            }
            let j = kiln_json(&args);
            assert_eq!(j.as_object().unwrap().len(), 2, "only ids and pieces");
            assert_eq!(j["ids"], v["ids"], "{name} {args:?}");
            let pieces: Vec<String> = v["pieces_hex"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| String::from_utf8_lossy(&hex(h.as_str().unwrap())).into_owned())
                .collect();
            assert_eq!(j["pieces"], serde_json::json!(pieces), "{name} {args:?}");
        }
    }
}

#[test]
fn plain_output_and_text_argument() {
    assert_eq!(kiln_ok(&["tokenize", "Hello world"]), "2 9259 1902\n");
    assert_eq!(
        kiln_ok(&["tokenize", "--no-bos", "Hello world"]),
        "9259 1902\n"
    );
    let chat = kiln_json(&["tokenize", "--special", "--json", "<start_of_turn>user"]);
    assert_eq!(chat["ids"], serde_json::json!([2, 105, 2364]));
    assert_eq!(
        chat["pieces"],
        serde_json::json!(["<bos>", "<start_of_turn>", "user"])
    );
    // Without --special the marker is plain text.
    let plain = kiln_json(&["tokenize", "--no-bos", "--json", "<start_of_turn>"]);
    assert!(!plain["ids"].as_array().unwrap().contains(&Value::from(105)));
}

#[test]
fn detokenize_round_trips() {
    assert_eq!(
        kiln_ok(&["detokenize", "2", "9259", "1902"]),
        "Hello world\n"
    );
    assert_eq!(
        kiln_ok(&["detokenize", "--special", "2,9259,1902"]),
        "<bos>Hello world\n"
    );
    let e = entries().into_iter().find(|e| e["name"] == "zh").unwrap();
    let ids: Vec<String> = e["variants"][0]["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.to_string())
        .collect();
    let mut args = vec!["detokenize"];
    args.extend(ids.iter().map(String::as_str));
    assert_eq!(kiln_ok(&args), "你好，世界\n");
    let out = kiln(&["detokenize", "262144"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "));
}

#[test]
fn usage_errors_and_help() {
    let out = kiln(&["tokenize"]);
    assert_eq!(out.status.code(), Some(2), "TEXT or --file is required");
    let out = kiln(&["tokenize", "--file", "/x", "text"]);
    assert_eq!(out.status.code(), Some(2), "TEXT and --file conflict");
    let help = kiln_ok(&["--help"]);
    for cmd in [
        "inspect",
        "tokenize",
        "detokenize",
        "KILN_MODEL",
        "scripts/fetch-model",
        "pull",
        "-hf REPO[:QUANT]",
    ] {
        assert!(help.contains(cmd), "{help}");
    }
}
