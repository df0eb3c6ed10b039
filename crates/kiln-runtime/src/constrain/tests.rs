use std::sync::Arc;

use super::*;

fn tokenizer(fixture: &str) -> Arc<Tokenizer> {
    let g = kiln_gguf::Gguf::open(kiln_testdata::fixture(&format!("{fixture}/model-f32.gguf")))
        .unwrap();
    Arc::new(Tokenizer::from_gguf(&g).unwrap())
}

/// Drives `c` with the lowest allowed id at every step (a deterministic
/// walk through the grammar); returns the text, or None if it did not
/// complete within `max` tokens.
fn walk(c: &mut Constraint, tok: &Tokenizer, max: usize) -> Option<String> {
    let eog = tok.eog_ids();
    let mut text = Vec::new();
    for _ in 0..max {
        let mut logits = vec![0.0f32; tok.n_vocab()];
        c.mask(&mut logits).unwrap();
        // Prefer ending when allowed, else the lowest allowed id.
        let id = eog
            .iter()
            .copied()
            .find(|&e| logits[e as usize] == 0.0)
            .or_else(|| logits.iter().position(|&l| l == 0.0).map(|i| i as u32))?;
        if eog.contains(&id) {
            return Some(String::from_utf8(text).unwrap());
        }
        c.accept(id).unwrap();
        text.extend_from_slice(&vocab::token_bytes(tok, id));
        if c.is_complete() {
            return Some(String::from_utf8(text).unwrap());
        }
    }
    None
}

#[test]
fn apply_mask_clears_every_forbidden_id() {
    let mut logits: Vec<f32> = (0..70).map(|i| i as f32).collect();
    // Word 0: ids 1 and 31; word 1: all; word 2 missing (ids 64..70 forbidden).
    apply_mask(&[(1 << 1) | (1 << 31), u32::MAX], &mut logits);
    for (i, &l) in logits.iter().enumerate() {
        let allowed = i == 1 || i == 31 || (32..64).contains(&i);
        assert_eq!(l.is_finite(), allowed, "id {i}");
    }
}

#[test]
fn choices_and_regexes_produce_only_matching_text() {
    let tok = tokenizer("gemma3-tiny");
    let g = Grammars::new(tok.clone()).unwrap();
    let mut c = g
        .compile(&ConstraintSpec::Choice(vec!["yes".into(), "no".into()]))
        .unwrap();
    let out = walk(&mut c, &tok, 16).unwrap();
    assert!(out == "yes" || out == "no", "{out:?}");
    let mut c = g
        .compile(&ConstraintSpec::Regex("[0-9]{3}-[a-c]{2}".into()))
        .unwrap();
    let out = walk(&mut c, &tok, 32).unwrap();
    assert_eq!(out.len(), 6, "{out:?}");
    assert!(out.as_bytes()[3] == b'-', "{out:?}");
    assert!(c.is_complete());
    assert_eq!(c.mask_times().len(), 6);
}

#[test]
fn json_schema_output_is_compact_and_valid() {
    let tok = tokenizer("gemma4-tiny");
    let g = Grammars::new(tok.clone()).unwrap();
    let schema = json!({
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9},
                       "b": {"type": "boolean"}},
        "required": ["n", "b"],
        "additionalProperties": false
    });
    let mut c = g.compile(&ConstraintSpec::JsonSchema(schema)).unwrap();
    let out = walk(&mut c, &tok, 64).unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["n"].as_i64().is_some_and(|n| (1..=9).contains(&n)),
        "{out}"
    );
    assert!(v["b"].is_boolean(), "{out}");
    assert!(out.contains("\": ") && !out.contains('\n'), "{out}");
}

#[test]
fn bad_specs_are_invalid_constraints_naming_the_problem() {
    let tok = tokenizer("gemma3-tiny");
    let g = Grammars::new(tok).unwrap();
    let cases = [
        (ConstraintSpec::Regex("(unclosed".into()), "regex"),
        (ConstraintSpec::Lark("start: undefined_rule".into()), "lark"),
        (ConstraintSpec::Lark("  ".into()), "lark"),
        (ConstraintSpec::Choice(vec![]), "choice"),
        (
            ConstraintSpec::JsonSchema(json!(["not", "an", "object"])),
            "json_schema",
        ),
        (
            ConstraintSpec::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
            "json_schema",
        ),
        (
            ConstraintSpec::JsonSchema(json!({"type": "no-such-type"})),
            "json_schema",
        ),
    ];
    for (spec, kind) in cases {
        match g.compile(&spec) {
            Err(RuntimeError::InvalidConstraint { kind: k, reason }) => {
                assert_eq!(k, kind);
                assert!(!reason.is_empty() && !reason.contains('\n'), "{reason}");
            }
            other => panic!("{spec:?}: expected InvalidConstraint, got {other:?}"),
        }
    }
}

#[test]
fn percentiles_pick_the_median_and_tail() {
    let t: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
    let (p50, p99) = percentiles(&t).unwrap();
    assert_eq!((p50.as_micros(), p99.as_micros()), (51, 99));
    assert_eq!(percentiles(&[]), None);
}
