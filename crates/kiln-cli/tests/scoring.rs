//! `kiln logits`, `kiln perplexity` and `kiln bench` on the real model
//! against llama.cpp's reference numbers (shared/refdata), kept short.

mod common;

use common::{assert_leading_keys, kiln, kiln_json, kiln_ok, TempDir};
use serde_json::Value;

fn model() -> String {
    kiln_testdata::real_model().to_str().unwrap().to_string()
}

fn refdata(name: &str) -> Value {
    serde_json::from_slice(&std::fs::read(kiln_testdata::refdata(name)).unwrap()).unwrap()
}

/// The reference's top-20 at the last position of "The capital of France
/// is" (the exact float64 forward pass).
fn reference_top() -> Vec<(u64, f64)> {
    let l = refdata("logits.json");
    let case = l["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["prompt_text"] == "The capital of France is")
        .expect("capital_france case")
        .clone();
    assert_eq!(
        case["prompt_ids"],
        serde_json::json!([2, 818, 5279, 529, 7001, 563])
    );
    case["configs"]["exact_f64_numpy"]["last_position_top20"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_u64().unwrap(), e["logit"].as_f64().unwrap()))
        .collect()
}

#[test]
fn logits_top5_matches_reference() {
    let m = model();
    let j = kiln_json(&[
        "logits",
        "-m",
        &m,
        "-p",
        "The capital of France is",
        "--top",
        "5",
        "--json",
    ]);
    assert_eq!(j["ids"], serde_json::json!([2, 818, 5279, 529, 7001, 563]));
    let top = j["top"].as_array().unwrap();
    assert_eq!(top.len(), 5);
    let want = reference_top();
    for (got, (id, logit)) in top.iter().zip(&want) {
        assert_eq!(got["id"].as_u64().unwrap(), *id, "{top:?}");
        // llama.cpp's own configurations differ by up to ~1.4 (refdata README).
        let d = (got["logit"].as_f64().unwrap() - logit).abs();
        assert!(d < 0.5, "id {id}: {} vs {logit}", got["logit"]);
    }
    // The table names the pieces.
    let table = kiln_ok(&[
        "logits",
        "-m",
        &m,
        "-p",
        "The capital of France is",
        "--top",
        "3",
    ]);
    assert!(
        table.contains("9079") && table.contains("\" Paris\""),
        "{table}"
    );
}

#[test]
fn logits_all_writes_the_full_matrix() {
    let m = model();
    let dir = TempDir::new("logits-all");
    let out = dir.0.join("all.bin");
    let ids = "2,818,5279,529,7001,563";
    let j = kiln_json(&[
        "logits",
        "-m",
        &m,
        "--ids",
        ids,
        "--all",
        "--top",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--json",
    ]);
    let bytes = std::fs::read(&out).unwrap();
    let (n, vocab) = (6usize, 262_144usize);
    assert_eq!(bytes.len(), n * vocab * 4);
    let rows: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let positions = j["positions"].as_array().unwrap();
    assert_eq!(positions.len(), n);
    for (i, pos) in positions.iter().enumerate() {
        let row = &rows[i * vocab..(i + 1) * vocab];
        let best = pos[0]["id"].as_u64().unwrap() as usize;
        assert_eq!(
            row[best],
            pos[0]["logit"].as_f64().unwrap() as f32,
            "position {i}"
        );
        assert!(row.iter().all(|&z| z <= row[best]), "position {i}");
    }
    // The last row is the last-position output.
    assert_eq!(j["top"], positions[n - 1]);
    assert_eq!(j["top"][0]["id"], reference_top()[0].0);
}

/// The first chunks of shared/refdata/perplexity_gpl3.txt at -c 128: the
/// running PPL is llama.cpp's within 5% (its own configurations spread
/// ~1%; Kiln does not quantize activations as ggml does).
#[test]
fn perplexity_on_a_short_text_is_finite_and_close_to_llama_cpp() {
    let m = model();
    let text = std::fs::read(kiln_testdata::refdata("perplexity_gpl3.txt")).unwrap();
    let dir = TempDir::new("ppl");
    let file = dir.0.join("gpl3-head.txt");
    // About 450 tokens; 2 chunks of 128 are scored.
    std::fs::write(&file, &text[..2000]).unwrap();
    let out = kiln(&[
        "perplexity",
        "-m",
        &m,
        "-f",
        file.to_str().unwrap(),
        "-c",
        "128",
        "--chunks",
        "2",
        "--json",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("[1]") && stderr.contains(",[2]"),
        "{stderr}"
    );
    let raw = String::from_utf8(out.stdout).unwrap();
    assert_eq!(raw.lines().count(), 1, "{raw}");
    assert_leading_keys(&raw, &["ppl", "n_ctx", "n_chunks", "chunks"]);
    let j: Value = serde_json::from_str(&raw).unwrap();
    assert_eq!(j["n_ctx"], 128);
    assert_eq!(j["n_chunks"], 2);
    assert_eq!(j["n_scored"], 2 * 63);
    let ppl = j["ppl"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{j}");
    let chunks = j["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[1].as_f64().unwrap(), ppl);
    let r = refdata("perplexity.json");
    let run = r["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|run| run["n_ctx"] == 128)
        .unwrap();
    let want = run["running_ppl_after_each_chunk"].as_array().unwrap();
    for (got, want) in chunks.iter().zip(want) {
        let (g, w) = (got.as_f64().unwrap(), want.as_f64().unwrap());
        assert!(
            (g / w - 1.0).abs() < 0.05,
            "running PPL {g} vs llama.cpp {w}"
        );
    }
}

/// `--chunks 1` scores one chunk when the text fills two (llama.cpp's
/// rule), and each chunk's entry ends `,` as in llama.cpp's running line.
/// The tiny fixture keeps it fast.
#[test]
fn perplexity_scores_a_single_chunk_on_request() {
    let m = kiln_testdata::fixture("gemma3-tiny/model-f32.gguf");
    let m = m.to_str().unwrap();
    let dir = TempDir::new("ppl-one");
    let file = dir.0.join("text.txt");
    std::fs::write(
        &file,
        "the quick brown fox jumps over the lazy dog. ".repeat(20),
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let run = |chunks: &str| {
        kiln(&[
            "perplexity",
            "-m",
            m,
            "-f",
            f,
            "-c",
            "16",
            "--chunks",
            chunks,
            "--json",
        ])
    };
    let out = run("1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["n_chunks"], 1);
    assert_eq!(j["n_scored"], 7);
    let ppl = j["ppl"].as_f64().unwrap();
    assert!(ppl.is_finite() && ppl > 1.0, "{j}");
    assert!(stderr.contains(&format!("\n[1]{ppl:.4},\n")), "{stderr}");
    let two: Value = serde_json::from_slice(&run("2").stdout).unwrap();
    assert_eq!(two["chunks"][0], j["chunks"][0]);
    assert_eq!(two["n_chunks"], 2);
    let zero = run("0");
    assert_eq!(zero.status.code(), Some(2), "{zero:?}");
}

#[test]
fn bench_json_lines_parse() {
    let m = model();
    let out = kiln_ok(&[
        "bench", "-m", &m, "-p", "16", "-n", "4", "-r", "1", "--json",
    ]);
    for l in out.lines() {
        assert_leading_keys(
            l,
            &[
                "test",
                "n_prompt",
                "n_gen",
                "depth",
                "threads",
                "reps",
                "avg_ts",
                "stddev_ts",
                "samples_ts",
                "load_s",
                "peak_rss_bytes",
            ],
        );
    }
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    let names: Vec<&str> = lines.iter().map(|l| l["test"].as_str().unwrap()).collect();
    assert_eq!(names, ["pp16", "tg4"]);
    assert_eq!(
        (lines[0]["n_prompt"].clone(), lines[0]["n_gen"].clone()),
        (16.into(), 0.into())
    );
    assert_eq!(
        (lines[1]["n_prompt"].clone(), lines[1]["n_gen"].clone()),
        (0.into(), 4.into())
    );
    for l in &lines {
        assert_eq!(l["reps"], 1);
        assert_eq!(l["depth"], 0);
        assert_eq!(l["samples_ts"].as_array().unwrap().len(), 1);
        assert!(l["avg_ts"].as_f64().unwrap() > 0.0, "{l}");
        assert!(l["load_s"].as_f64().unwrap() > 0.0, "{l}");
        // The model is mapped and touched: RSS exceeds 100 MB.
        assert!(l["peak_rss_bytes"].as_u64().unwrap() > 100 << 20, "{l}");
        let isa = l["isa"].as_str().unwrap();
        assert!(
            ["scalar", "avx2", "avx512", "avx512vnni", "amx"].contains(&isa),
            "{l}"
        );
    }
}
