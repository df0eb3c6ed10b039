use std::sync::Arc;

use serde_json::{json, Value};

use super::*;
use crate::constrain::{Constraint, Grammars};
use crate::rng::Rng;
use crate::tools::{ReplyEvent, ReplyParser};

fn grammars(fixture: &str) -> (Grammars, Arc<kiln_tokenizer::Tokenizer>) {
    let g = kiln_gguf::Gguf::open(kiln_testdata::fixture(&format!("{fixture}/model-f32.gguf")))
        .unwrap();
    let tok = Arc::new(kiln_tokenizer::Tokenizer::from_gguf(&g).unwrap());
    (Grammars::new(tok.clone()).unwrap(), tok)
}

/// Random allowed tokens (EOS as soon as it is allowed) until the
/// constraint completes; the text.
fn random_walk(c: &mut Constraint, tok: &kiln_tokenizer::Tokenizer, seed: u64) -> String {
    let mut rng = Rng::new(seed);
    let eog = tok.eog_ids();
    let mut text = String::new();
    let mut dec = kiln_tokenizer::StreamDecoder::new(tok, false);
    for _ in 0..2000 {
        let mut logits = vec![0.0f32; tok.n_vocab()];
        c.mask(&mut logits).unwrap();
        if eog.iter().any(|&e| logits[e as usize] == 0.0) {
            return text + &dec.finish();
        }
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize] == 0.0)
            .collect();
        let id = allowed[(rng.next_f64() * allowed.len() as f64) as usize % allowed.len()];
        c.accept(id).unwrap();
        text.push_str(&dec.push(id).unwrap());
        if c.is_complete() {
            return text + &dec.finish();
        }
    }
    panic!("no end after 2000 tokens: {text:?}");
}

fn tools() -> Vec<ToolDef> {
    vec![
        ToolDef {
            name: "get_weather".into(),
            description: "Weather in a city".into(),
            parameters: json!({"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["c", "f"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                "required": ["city", "days"], "additionalProperties": false}),
        },
        ToolDef {
            name: "plan".into(),
            description: "".into(),
            parameters: json!({"type": "object", "$defs": {"stop": {"type": "object",
                "properties": {"at": {"type": "string", "format": "date"}, "ok": {"type": "boolean"}},
                "required": ["at"], "additionalProperties": false}},
                "properties": {"stops": {"type": "array", "items": {"$ref": "#/$defs/stop"},
                    "minItems": 1, "maxItems": 2},
                 "note": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 4}]}},
                "required": ["stops"], "additionalProperties": false}),
        },
    ]
}

fn check_args(name: &str, a: &Value) {
    match name {
        "get_weather" => {
            assert!(
                a["city"].as_str().is_some_and(|c| c.chars().count() <= 8),
                "{a}"
            );
            assert!(
                a["days"].as_i64().is_some_and(|d| (1..=7).contains(&d)),
                "{a}"
            );
            assert!(a.get("unit").is_none_or(|u| u == "c" || u == "f"), "{a}");
        }
        "plan" => {
            let stops = a["stops"].as_array().unwrap();
            assert!((1..=2).contains(&stops.len()), "{a}");
            for s in stops {
                let at = s["at"].as_str().unwrap();
                assert_eq!((at.len(), &at[4..5]), (10, "-"), "{a}");
            }
        }
        other => panic!("unknown function {other}"),
    }
}

#[test]
fn gemma4_calls_sampled_under_the_grammar_parse_and_fit_their_schemas() {
    let (g, tok) = grammars("gemma4-tiny");
    for choice in [ToolChoice::Required, ToolChoice::Named("plan".into())] {
        {
            let spec = tool_calls(ToolSyntax::Gemma4, &tools(), &choice, false)
                .unwrap()
                .unwrap();
            let base = g.compile(&spec).unwrap();
            for seed in 0..8 {
                let text = random_walk(&mut base.clone(), &tok, seed);
                let mut p = ReplyParser::new(Some(ToolSyntax::Gemma4), true);
                let mut evs = p.push(&text);
                evs.extend(p.finish());
                let calls: Vec<_> = evs
                    .iter()
                    .filter_map(|e| match e {
                        ReplyEvent::ToolCall(c) => Some(c),
                        _ => None,
                    })
                    .collect();
                assert!(!calls.is_empty(), "{choice:?} {text:?}");
                for c in &calls {
                    if let ToolChoice::Named(n) = &choice {
                        assert_eq!(&c.name, n);
                    }
                    check_args(&c.name, &c.arguments);
                }
                assert!(
                    evs.iter().all(|e| !matches!(e, ReplyEvent::Content(_))),
                    "{text:?}"
                );
            }
        }
    }
}

#[test]
fn a_thought_may_precede_the_calls_with_thinking_on() {
    let (g, tok) = grammars("gemma4-tiny");
    let spec = tool_calls(ToolSyntax::Gemma4, &tools(), &ToolChoice::Required, true)
        .unwrap()
        .unwrap();
    let mut c = g.compile(&spec).unwrap();
    for id in tok.encode("<|channel>thought\nweather first<channel|>", false, false) {
        c.accept(id).unwrap();
    }
    let text = random_walk(&mut c, &tok, 1);
    let (name, args) = ToolSyntax::Gemma4
        .parse_call(
            text.strip_prefix("<|tool_call>")
                .unwrap()
                .strip_suffix("<tool_call|>")
                .unwrap_or(&text),
        )
        .unwrap_or_else(|e| panic!("{e}: {text:?}"));
    check_args(&name, &args);
}

#[test]
fn json_block_calls_fit_their_schemas() {
    let (g, tok) = grammars("gemma3-tiny");
    let spec = tool_calls(
        ToolSyntax::JsonBlock,
        &tools(),
        &ToolChoice::Required,
        false,
    )
    .unwrap()
    .unwrap();
    let base = g.compile(&spec).unwrap();
    for seed in 0..6 {
        let text = random_walk(&mut base.clone(), &tok, seed);
        let mut p = ReplyParser::new(Some(ToolSyntax::JsonBlock), false);
        let mut evs = p.push(&text);
        evs.extend(p.finish());
        assert!(!evs.is_empty(), "{text:?}");
        for e in evs {
            match e {
                ReplyEvent::ToolCall(c) => check_args(&c.name, &c.arguments),
                other => panic!("{other:?} in {text:?}"),
            }
        }
    }
}

#[test]
fn auto_allows_text_and_none_or_an_unknown_name_constrain_nothing() {
    let (g, tok) = grammars("gemma4-tiny");
    let spec = tool_calls(ToolSyntax::Gemma4, &tools(), &ToolChoice::Auto, false)
        .unwrap()
        .unwrap();
    let mut c = g.compile(&spec).unwrap();
    // Plain text is allowed, and EOS right away.
    let hello = tok.encode("Hello", false, false);
    let mut logits = vec![0.0f32; tok.n_vocab()];
    c.mask(&mut logits).unwrap();
    assert!(logits[hello[0] as usize] == 0.0);
    assert!(tok.eog_ids().iter().any(|&e| logits[e as usize] == 0.0));
    for choice in [ToolChoice::None, ToolChoice::Named("nope".into())] {
        assert_eq!(
            tool_calls(ToolSyntax::Gemma4, &tools(), &choice, false).unwrap(),
            None
        );
    }
}

#[test]
fn malformed_tool_schemas_are_errors_naming_the_function() {
    let bad = [
        json!({"type": "object", "properties": {"a": {"type": "nope"}}}),
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
        json!({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]}),
        json!({"type": "object", "properties": {"a": {"enum": []}}}),
        json!({"type": "object", "properties": {"a": {"type": "array", "minItems": 3, "maxItems": 1}}}),
    ];
    for p in bad {
        let t = ToolDef {
            name: "f".into(),
            description: "".into(),
            parameters: p.clone(),
        };
        let e = tool_calls(ToolSyntax::Gemma4, &[t], &ToolChoice::Required, false).unwrap_err();
        assert!(e.to_string().contains("function \"f\""), "{p}: {e}");
    }
}

#[test]
fn gemma4_json_with_the_thought_prefix_compiles() {
    let (g, tok) = grammars("gemma4-tiny");
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["a"]});
    for thinking in [false, true] {
        let spec = with_gemma4_thought(ConstraintSpec::JsonSchema(schema.clone()), thinking);
        let mut c = g.compile(&spec).unwrap();
        let text = random_walk(&mut c, &tok, 3);
        let json_part = text.rsplit("<channel|>").next().unwrap();
        let v: Value = serde_json::from_str(json_part).unwrap();
        assert!(
            v["a"].as_i64().is_some_and(|a| (0..=5).contains(&a)),
            "{text}"
        );
    }
}
