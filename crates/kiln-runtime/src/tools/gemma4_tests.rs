use serde_json::json;

use super::*;

#[test]
fn values_render_as_the_template_does() {
    let mut s = String::new();
    let v = json!({"b": [1, 2.5, true, null], "A": {"x": "y"}, "c": "q\"uote"});
    format_value(&v, false, &mut s);
    assert_eq!(
        s,
        r#"{A:{x:<|"|>y<|"|>},b:[1,2.5,true,None],c:<|"|>q"uote<|"|>}"#
    );
    s.clear();
    format_value(&json!({"k": "v"}), true, &mut s);
    assert_eq!(s, r#"{<|"|>k<|"|>:<|"|>v<|"|>}"#);
    s.clear();
    format_call("get_weather", &json!({"city": "Paris", "days": 3}), &mut s);
    assert_eq!(
        s,
        r#"<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>"#
    );
    s.clear();
    format_response("get_weather", "sunny", &mut s);
    assert_eq!(
        s,
        r#"<|tool_response>response:get_weather{value:<|"|>sunny<|"|>}<tool_response|>"#
    );
}

#[test]
fn declarations_match_the_pinned_gemma4_template() {
    // Rendered by the official template (transformers' apply_chat_template).
    let tool = ToolDef {
        name: "weather".into(),
        description: "Weather".into(),
        parameters: json!({"type": "object",
            "properties": {"city": {"type": "string", "description": "City"}},
            "required": ["city"]}),
    };
    let mut s = String::new();
    declaration(&tool, &mut s);
    assert_eq!(
        s,
        r#"<|tool>declaration:weather{description:<|"|>Weather<|"|>,parameters:{properties:{city:{description:<|"|>City<|"|>,type:<|"|>STRING<|"|>}},required:[<|"|>city<|"|>],type:<|"|>OBJECT<|"|>}}<tool|>"#
    );
    let nested = ToolDef {
        name: "f".into(),
        description: "d".into(),
        parameters: json!({"type": "object", "properties": {
            "unit": {"type": "string", "enum": ["c", "f"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "opt": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}),
    };
    s.clear();
    declaration(&nested, &mut s);
    assert_eq!(
        s,
        r#"<|tool>declaration:f{description:<|"|>d<|"|>,parameters:{properties:{opt:{properties:{n:{type:<|"|>INTEGER<|"|>}},required:[<|"|>n<|"|>],type:<|"|>OBJECT<|"|>},tags:{items:{type:<|"|>STRING<|"|>},type:<|"|>ARRAY<|"|>},unit:{enum:[<|"|>c<|"|>,<|"|>f<|"|>],type:<|"|>STRING<|"|>}},type:<|"|>OBJECT<|"|>}}<tool|>"#
    );
}

#[test]
fn calls_parse_with_quote_tokens_nesting_numbers_and_booleans() {
    let (name, args) = parse_call(
        r#"call:plan{trip:{cities:[<|"|>Paris<|"|>,<|"|>Rome, "it"<|"|>],days:3},budget:-1.5e3,ok:true,note:None}"#,
    )
    .unwrap();
    assert_eq!(name, "plan");
    assert_eq!(
        args,
        json!({"trip": {"cities": ["Paris", "Rome, \"it\""], "days": 3},
               "budget": -1500.0, "ok": true, "note": null})
    );
    // Lenient: JSON strings, quoted keys and spaces, as models sometimes write.
    let (_, args) = parse_call(r#"call:f{ "a" : "x\ny", <|"|>b<|"|>: [ ] }"#).unwrap();
    assert_eq!(args, json!({"a": "x\ny", "b": []}));
    assert_eq!(parse_call("call:f{}").unwrap().1, json!({}));
}

#[test]
fn malformed_calls_are_errors_never_panics() {
    for bad in [
        "",
        "call:",
        "call:{a:1}",
        "cal:f{}",
        "call:f{a:1",
        "call:f{a:<|\"|>x}",
        "call:f{a 1}",
        "call:f{a:1}}",
        "call:f{a:tru}",
        "call:f[1]",
        "call:f{a:\"\\q\"}",
        "call:f{:1}",
    ] {
        assert!(parse_call(bad).is_err(), "{bad:?}");
    }
    let deep = format!("call:f{{a:{}{}}}", "[".repeat(500), "]".repeat(500));
    assert_eq!(parse_call(&deep).unwrap_err().what, "nested too deeply");
    // Multi-byte text around the markers stays on char boundaries.
    assert!(parse_value("<|\"|>é").is_err());
    assert_eq!(parse_value("<|\"|>é<|\"|>").unwrap(), json!("é"));
}
