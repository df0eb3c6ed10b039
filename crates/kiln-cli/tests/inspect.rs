//! `kiln inspect` shows the config Kiln derives: the real Gemma 3 270M's
//! known facts, and for each fixture what fixtures/MANIFEST.md (and its
//! config.json `layer_types`) describe.

mod common;

use common::{kiln_json, kiln_ok};
use serde_json::Value;

fn layers(j: &Value) -> &Vec<Value> {
    j["config"]["layers"].as_array().expect("config.layers")
}

#[test]
fn real_model_facts() {
    let model = kiln_testdata::real_model();
    let j = kiln_json(&["inspect", "--json", model.to_str().unwrap()]);
    assert_eq!(j["version"], 3);
    assert_eq!(j["metadata"]["general.architecture"], "gemma3");
    // Long arrays are summarized.
    assert_eq!(j["metadata"]["tokenizer.ggml.tokens"]["len"], 262144);
    assert_eq!(
        j["metadata"]["tokenizer.ggml.tokens"]["head"]
            .as_array()
            .unwrap()
            .len(),
        8
    );
    let c = &j["config"];
    assert_eq!(
        (c["arch"].as_str(), c["n_layer"].as_u64()),
        (Some("gemma3"), Some(18))
    );
    assert_eq!(c["sliding_window"], 512);
    assert!(c["attn_softcap"].is_null() && c["final_softcap"].is_null());
    let ls = layers(&j);
    assert_eq!(ls.len(), 18);
    for (i, l) in ls.iter().enumerate() {
        let global = [5, 11, 17].contains(&i);
        assert_eq!(l["sliding"], !global, "layer {i}");
        assert_eq!(
            (
                l["head_dim"].as_u64(),
                l["n_head"].as_u64(),
                l["n_kv_head"].as_u64()
            ),
            (Some(256), Some(4), Some(1))
        );
        let (base, window) = if global {
            (1e6, Value::Null)
        } else {
            (1e4, Value::from(512))
        };
        assert_eq!(l["rope"]["base"].as_f64(), Some(base), "layer {i}");
        assert_eq!(l["rope"]["freq_scale"].as_f64(), Some(1.0));
        assert_eq!(l["window"], window, "layer {i}");
        assert_eq!(l["kv_source"], i, "no KV sharing in Gemma 3");
    }
    let by_type = &j["tensors"]["by_type"];
    let counted: u64 = by_type
        .as_object()
        .unwrap()
        .values()
        .map(|s| s["count"].as_u64().unwrap())
        .sum();
    assert_eq!(counted, j["tensors"]["count"].as_u64().unwrap());
    assert!(by_type["Q4_K"]["count"].as_u64().unwrap() > 0);
}

#[test]
fn real_model_text() {
    let out = kiln_ok(&["inspect"]);
    assert!(
        out.contains("  general.architecture = \"gemma3\"\n"),
        "{out}"
    );
    assert!(
        out.contains("tokenizer.ggml.tokens = [string; 262144] [\"<pad>\""),
        "{out}"
    );
    assert!(
        out.contains("arch gemma3, 18 layers, n_embd 640, n_vocab 262144"),
        "{out}"
    );
    let globals: Vec<&str> = out.lines().filter(|l| l.contains(" global ")).collect();
    assert_eq!(globals.len(), 3, "{out}");
    for (line, i) in globals.iter().zip([5, 11, 17]) {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            &f[..9],
            [
                i.to_string().as_str(),
                "global",
                "none",
                "4",
                "1",
                "256",
                "2048",
                "1000000",
                "1"
            ]
        );
    }
}

#[test]
fn long_strings_are_cut_in_text() {
    let path = kiln_testdata::fixture("gemma3-tiny/model-f32.gguf");
    let out = kiln_ok(&["inspect", path.to_str().unwrap()]);
    let tmpl = out
        .lines()
        .find(|l| l.contains("tokenizer.chat_template"))
        .unwrap();
    assert!(
        tmpl.starts_with("  tokenizer.chat_template = \"{{ bos_token }}"),
        "{tmpl}"
    );
    assert!(tmpl.ends_with(" bytes)"), "{tmpl}");
    assert!(out.contains("\ntensors: "), "{out}");
    let j = kiln_json(&["inspect", "--json", path.to_str().unwrap()]);
    let full = j["metadata"]["tokenizer.chat_template"].as_str().unwrap();
    assert!(
        full.len() > 200 && full.contains("<start_of_turn>"),
        "JSON keeps the whole template"
    );
}

/// One row of the MANIFEST.md models table.
struct Manifest {
    layers: u64,
    hidden: u64,
    n_head: u64,
    kv_swa: u64,
    kv_global: u64,
    head_dim_swa: u64,
    head_dim_global: u64,
}

fn manifest(model: &str) -> Manifest {
    let text = std::fs::read_to_string(kiln_testdata::fixture("MANIFEST.md")).unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with(&format!("| `{model}/`")))
        .unwrap_or_else(|| panic!("{model} not in MANIFEST.md"));
    let cols: Vec<&str> = row.split('|').map(str::trim).collect();
    let num = |s: &str| {
        let t = s.trim_matches(|c: char| !c.is_ascii_digit());
        t.parse::<u64>()
            .unwrap_or_else(|e| panic!("{model}: {s:?}: {e}"))
    };
    // "4/2 (global 1)" or "4/1"; "32/64" or "32".
    let (q, rest) = cols[5].split_once('/').unwrap();
    let kv_swa = num(rest.split_whitespace().next().unwrap());
    let kv_global = rest.split_once("global").map_or(kv_swa, |(_, g)| num(g));
    let (hd_swa, hd_global) = cols[6]
        .split_once('/')
        .map_or_else(|| (num(cols[6]), num(cols[6])), |(a, b)| (num(a), num(b)));
    Manifest {
        layers: num(cols[3]),
        hidden: num(cols[4]),
        n_head: num(q),
        kv_swa,
        kv_global,
        head_dim_swa: hd_swa,
        head_dim_global: hd_global,
    }
}

#[test]
fn fixtures_match_manifest() {
    let models = kiln_testdata::fixture_models();
    assert_eq!(models.len(), 6);
    for model in models {
        let m = manifest(&model);
        let path = kiln_testdata::fixture(&format!("{model}/model-f32.gguf"));
        let j = kiln_json(&["inspect", "--json", path.to_str().unwrap()]);
        let config: Value = serde_json::from_str(
            &std::fs::read_to_string(kiln_testdata::fixture(&format!("{model}/config.json")))
                .unwrap(),
        )
        .unwrap();
        let types = config["layer_types"].as_array().unwrap();
        let c = &j["config"];
        assert_eq!(
            (c["n_layer"].as_u64(), c["n_embd"].as_u64()),
            (Some(m.layers), Some(m.hidden)),
            "{model}"
        );
        let ls = layers(&j);
        assert_eq!(ls.len() as u64, m.layers);
        for (i, l) in ls.iter().enumerate() {
            let sliding = types[i] == "sliding_attention";
            let ctx = format!("{model} layer {i}");
            assert_eq!(l["sliding"], sliding, "{ctx}");
            assert_eq!(l["n_head"], m.n_head, "{ctx}");
            let (kv, hd) = if sliding {
                (m.kv_swa, m.head_dim_swa)
            } else {
                (m.kv_global, m.head_dim_global)
            };
            assert_eq!(
                (l["n_kv_head"].as_u64(), l["head_dim"].as_u64()),
                (Some(kv), Some(hd)),
                "{ctx}"
            );
            assert_eq!(
                l["window"],
                if sliding {
                    Value::from(16)
                } else {
                    Value::Null
                },
                "{ctx}"
            );
        }
        // MANIFEST: linear RoPE factor 8 on the global layers only;
        // gemma2-tiny caps attention at 10 and logits at 30.
        for l in ls {
            let scaled = model == "gemma3-ropescale-tiny" && l["sliding"] == false;
            let expected = if scaled { 0.125 } else { 1.0 };
            assert_eq!(l["rope"]["freq_scale"].as_f64(), Some(expected), "{model}");
        }
        if model == "gemma2-tiny" {
            assert_eq!(
                (c["attn_softcap"].as_f64(), c["final_softcap"].as_f64()),
                (Some(10.0), Some(30.0))
            );
        }
        // MANIFEST: layers 5..9 of gemma4-e2b-tiny reuse the K/V of layer 3
        // (sliding) or 4 (global).
        let sources: Vec<u64> = ls
            .iter()
            .map(|l| l["kv_source"].as_u64().unwrap())
            .collect();
        if model == "gemma4-e2b-tiny" {
            assert_eq!(sources, [0, 1, 2, 3, 4, 3, 3, 3, 3, 4]);
        } else {
            assert_eq!(sources, (0..m.layers).collect::<Vec<_>>(), "{model}");
        }
    }
}
