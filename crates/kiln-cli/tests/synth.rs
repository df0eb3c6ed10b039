//! `kiln synth` writes a model that `kiln inspect` and `kiln run` accept.

mod common;

use common::{kiln, kiln_json, kiln_ok, TempDir};

#[test]
fn synth_270m_has_the_real_layout_and_runs() {
    let dir = TempDir::new("synth");
    let out = dir.0.join("g3-270m.gguf");
    let out_s = out.to_str().unwrap();
    let real = kiln_testdata::real_model();
    let report = kiln_ok(&[
        "synth",
        "--arch",
        "gemma3",
        "--size",
        "270m",
        "--quant",
        "q4_k_m",
        "--tokenizer-from",
        real.to_str().unwrap(),
        "-o",
        out_s,
    ]);
    assert!(
        report.contains("Q5_0") && report.contains("Q6_K"),
        "{report}"
    );

    let synth = kiln_json(&["inspect", out_s, "--json"]);
    let real = kiln_json(&["inspect", real.to_str().unwrap(), "--json"]);
    assert_eq!(
        synth["config"], real["config"],
        "derived Gemma config differs"
    );
    assert_eq!(
        synth["tensors"], real["tensors"],
        "tensor counts and bytes by type differ"
    );

    let gen = kiln_json(&[
        "run",
        "-m",
        out_s,
        "--ids",
        "2,818,5279",
        "-n",
        "2",
        "--temp",
        "0",
        "--json",
    ]);
    assert_eq!(gen["ids"].as_array().unwrap().len(), 2);
}

#[test]
fn synth_rejects_unknown_models_and_quants() {
    let dir = TempDir::new("synth-bad");
    let out = dir.0.join("x.gguf");
    for args in [
        ["--arch", "gemma3", "--size", "3b", "--quant", "q4_k_m"],
        ["--arch", "llama", "--size", "1b", "--quant", "q4_k_m"],
        ["--arch", "gemma3", "--size", "1b", "--quant", "q3_k_s"],
    ] {
        let mut a = vec!["synth"];
        a.extend(args);
        a.extend(["-o", out.to_str().unwrap()]);
        let o = kiln(&a);
        assert_eq!(o.status.code(), Some(1), "{a:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.starts_with("error: ") && !err.contains("panicked"),
            "{err}"
        );
        assert!(!out.exists(), "no file on failure");
    }
}
