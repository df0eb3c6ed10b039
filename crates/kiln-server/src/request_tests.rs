//! Parsing and validation of request bodies.

use super::*;

fn limits() -> Limits {
    Limits {
        n_vocab: 1000,
        max_context: 512,
        ..Limits::default()
    }
}

fn completion(body: &str) -> Result<GenerateRequest, ApiError> {
    parse_completion(body.as_bytes(), &limits())
}

fn chat(body: &str) -> Result<GenerateRequest, ApiError> {
    parse_chat(body.as_bytes(), &limits())
}

/// The error's `param` and message.
fn err(r: Result<GenerateRequest, ApiError>) -> (Option<String>, String) {
    let e = r.expect_err("an error");
    assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST);
    (e.param, e.message)
}

#[test]
fn a_full_completion_request_maps_every_parameter() {
    let r = completion(
        r#"{"model":"m","prompt":"Hi","max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":40,
            "min_p":0.05,"presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.1,
            "seed":-1,"stop":"\n","logit_bias":{"5":-100,"7":2.5},"n":3,"logprobs":2,"echo":true,
            "stream":true,"stream_options":{"include_usage":true},"ignore_eos":true,"user":"x"}"#,
    )
    .unwrap();
    assert_eq!(r.model.as_deref(), Some("m"));
    assert_eq!(r.prompt, PromptInput::Text("Hi".into()));
    assert_eq!((r.max_tokens, r.n, r.logprobs), (Some(7), 3, Some(2)));
    assert!(r.echo && r.stream && r.include_usage && r.seeded && r.params.ignore_eos);
    let p = &r.params;
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.min_p),
        (0.5, 0.9, 40, 0.05)
    );
    assert_eq!(
        (
            p.presence_penalty,
            p.frequency_penalty,
            p.repetition_penalty
        ),
        (0.5, -0.5, 1.1)
    );
    assert_eq!(p.seed, u64::MAX);
    assert_eq!(p.stop, vec!["\n".to_string()]);
    assert_eq!(p.logit_bias.get(&5), Some(&-100.0));
    assert_eq!(p.logit_bias.get(&7), Some(&2.5));
    p.validate().unwrap();
}

#[test]
fn defaults_are_openai_neutral() {
    let r = completion(r#"{"prompt":[2, 10, 11]}"#).unwrap();
    assert_eq!(r.prompt, PromptInput::Tokens(vec![2, 10, 11]));
    assert_eq!(
        (r.max_tokens, r.n, r.logprobs, r.stream, r.seeded),
        (None, 1, None, false, false)
    );
    let p = &r.params;
    assert_eq!(
        (p.temperature, p.top_p, p.top_k, p.min_p),
        (1.0, 1.0, 0, 0.0)
    );
    assert!(p.stop.is_empty() && p.logit_bias.is_empty() && !p.ignore_eos);
    // null is absent; a one-element list is its element; top_k -1 is off.
    let r =
        completion(r#"{"prompt":["Hi"],"temperature":null,"top_k":-1,"max_tokens":2.0}"#).unwrap();
    assert_eq!(
        (r.prompt, r.params.top_k, r.max_tokens),
        (PromptInput::Text("Hi".into()), 0, Some(2))
    );
}

#[test]
fn chat_messages_roles_and_content_parts() {
    let r = chat(
        r#"{"messages":[{"role":"developer","content":"Be terse."},
                        {"role":"user","content":[{"type":"text","text":"Hi "},{"type":"text","text":"there"}]},
                        {"role":"assistant","content":null}],
            "max_completion_tokens":5,"max_tokens":9,"logprobs":true,"top_logprobs":4}"#,
    )
    .unwrap();
    let PromptInput::Chat(m) = r.prompt else {
        panic!("chat prompt expected");
    };
    assert_eq!(
        m,
        vec![
            ChatMessage::system("Be terse."),
            ChatMessage::user("Hi there"),
            ChatMessage::assistant("")
        ]
    );
    // max_completion_tokens wins over the deprecated max_tokens.
    assert_eq!((r.max_tokens, r.logprobs), (Some(5), Some(4)));
    assert_eq!(
        chat(r#"{"messages":[{"role":"user","content":"x"}],"logprobs":true}"#)
            .unwrap()
            .logprobs,
        Some(0)
    );
}

#[test]
fn every_bad_field_is_a_400_naming_it() {
    let cases: &[(&str, &str)] = &[
        (r#"{"prompt":"x","temperature":2.5}"#, "temperature"),
        (r#"{"prompt":"x","temperature":"hot"}"#, "temperature"),
        (r#"{"prompt":"x","top_p":0}"#, "top_p"),
        (r#"{"prompt":"x","top_p":1e-50}"#, "top_p"),
        (r#"{"prompt":"x","top_k":-2}"#, "top_k"),
        (r#"{"prompt":"x","min_p":1.5}"#, "min_p"),
        (r#"{"prompt":"x","presence_penalty":3}"#, "presence_penalty"),
        (
            r#"{"prompt":"x","frequency_penalty":-3}"#,
            "frequency_penalty",
        ),
        (
            r#"{"prompt":"x","repetition_penalty":0}"#,
            "repetition_penalty",
        ),
        (r#"{"prompt":"x","seed":1.5}"#, "seed"),
        (r#"{"prompt":"x","stop":[""]}"#, "stop"),
        (r#"{"prompt":"x","stop":[1]}"#, "stop"),
        (
            r#"{"prompt":"x","stop":["a","b","c","d","e","f","g","h","i","j","k","l","m","n","o","p","q"]}"#,
            "stop",
        ),
        (r#"{"prompt":"x","logit_bias":{"abc":1}}"#, "logit_bias"),
        (r#"{"prompt":"x","logit_bias":{"1000":1}}"#, "logit_bias"),
        (r#"{"prompt":"x","logit_bias":{"5":101}}"#, "logit_bias"),
        (r#"{"prompt":"x","logit_bias":[1]}"#, "logit_bias"),
        (r#"{"prompt":"x","n":0}"#, "n"),
        (r#"{"prompt":"x","n":17}"#, "n"),
        (r#"{"prompt":"x","max_tokens":0}"#, "max_tokens"),
        (r#"{"prompt":"x","max_tokens":513}"#, "max_tokens"),
        (r#"{"prompt":"x","logprobs":21}"#, "logprobs"),
        (r#"{"prompt":"x","stream":1}"#, "stream"),
        (
            r#"{"prompt":"x","stream_options":{"include_usage":"yes"}}"#,
            "stream_options.include_usage",
        ),
        (r#"{"prompt":"x","model":5}"#, "model"),
        (r#"{"prompt":"x","ignore_eos":"no"}"#, "ignore_eos"),
        (r#"{"prompt":"x","echo":0}"#, "echo"),
        (r#"{"prompt":"x","suffix":"y"}"#, "suffix"),
        (r#"{"prompt":""}"#, "prompt"),
        (r#"{"prompt":[]}"#, "prompt"),
        (r#"{"prompt":[1000]}"#, "prompt"),
        (r#"{"prompt":[-1]}"#, "prompt"),
        (r#"{"prompt":["a","b"]}"#, "prompt"),
        (r#"{"prompt":{"text":"x"}}"#, "prompt"),
        (r#"{}"#, "prompt"),
    ];
    for (body, param) in cases {
        let (p, msg) = err(completion(body));
        assert_eq!(p.as_deref(), Some(*param), "{body}: {msg}");
        assert!(!msg.is_empty());
    }
    let chat_cases: &[(&str, &str)] = &[
        (r#"{}"#, "messages"),
        (r#"{"messages":[]}"#, "messages"),
        (r#"{"messages":"hi"}"#, "messages"),
        (r#"{"messages":[5]}"#, "messages[0]"),
        (r#"{"messages":[{"content":"x"}]}"#, "messages[0].role"),
        (
            r#"{"messages":[{"role":"narrator","content":"x"}]}"#,
            "messages[0].role",
        ),
        (
            r#"{"messages":[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"{"}}]}]}"#,
            "messages[0].tool_calls",
        ),
        (r#"{"messages":[{"role":"user"}],"tools":{}}"#, "tools"),
        (
            r#"{"messages":[{"role":"user"}],"tools":[{"type":"retrieval"}]}"#,
            "tools[0].type",
        ),
        (
            r#"{"messages":[{"role":"user"}],"tools":[{"type":"function","function":{"name":"a b"}}]}"#,
            "tools[0].function.name",
        ),
        (
            r#"{"messages":[{"role":"user"}],"tools":[{"type":"function","function":{"name":"f","parameters":3}}]}"#,
            "tools[0].function.parameters",
        ),
        (
            r#"{"messages":[{"role":"user"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}"#,
            "tool_choice",
        ),
        (
            r#"{"messages":[{"role":"user"}],"tool_choice":"required"}"#,
            "tool_choice",
        ),
        (
            r#"{"messages":[{"role":"user"}],"response_format":{"type":"xml"}}"#,
            "response_format.type",
        ),
        (
            r#"{"messages":[{"role":"user"}],"response_format":{"type":"json_schema","json_schema":{"schema":[]}}}"#,
            "response_format.json_schema.schema",
        ),
        (
            r#"{"messages":[{"role":"user"}],"reasoning_effort":"max"}"#,
            "reasoning_effort",
        ),
        (
            r#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"messages":[{"role":"user","content":5}]}"#,
            "messages[0].content",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}"#,
            "top_logprobs",
        ),
        (
            r#"{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-1}"#,
            "max_completion_tokens",
        ),
    ];
    for (body, param) in chat_cases {
        let (p, msg) = err(chat(body));
        assert_eq!(p.as_deref(), Some(*param), "{body}: {msg}");
    }
}

#[test]
fn malformed_bodies_say_what_is_wrong() {
    for (body, fragment) in [
        (&b"{"[..], "not valid JSON"),
        (b"\xff{}", "not valid UTF-8"),
        (b"[]", "must be a JSON object"),
        (b"", "not valid JSON"),
    ] {
        let e = parse_completion(body, &limits()).unwrap_err();
        assert!(e.message.contains(fragment), "{body:?}: {}", e.message);
        assert_eq!(e.param, None);
    }
}

#[test]
fn embeddings_inputs_pooling_and_format() {
    let l = limits();
    let r = parse_embeddings(br#"{"input":"a"}"#, &l).unwrap();
    assert_eq!(
        (r.inputs, r.pooling, r.base64),
        (vec![PromptInput::Text("a".into())], Pooling::Mean, false)
    );
    let r = parse_embeddings(
        br#"{"input":["a",[2,3]],"pooling":"last","encoding_format":"base64"}"#,
        &l,
    )
    .unwrap();
    assert_eq!(
        r.inputs,
        vec![
            PromptInput::Text("a".into()),
            PromptInput::Tokens(vec![2, 3])
        ]
    );
    assert_eq!((r.pooling, r.base64), (Pooling::Last, true));
    assert_eq!(
        parse_embeddings(br#"{"input":[2,3]}"#, &l).unwrap().inputs,
        vec![PromptInput::Tokens(vec![2, 3])]
    );
    for (body, param) in [
        (&br#"{}"#[..], "input"),
        (br#"{"input":[1, "a"]}"#, "input"),
        (br#"{"input":"a","pooling":"max"}"#, "pooling"),
        (
            br#"{"input":"a","encoding_format":"hex"}"#,
            "encoding_format",
        ),
        (br#"{"input":"a","dimensions":8}"#, "dimensions"),
    ] {
        let e = parse_embeddings(body, &l).unwrap_err();
        assert_eq!(
            e.param.as_deref(),
            Some(param),
            "{}",
            String::from_utf8_lossy(body)
        );
    }
}

#[test]
fn tokenize_and_detokenize_bodies() {
    assert_eq!(
        parse_tokenize(br#"{"content":"hi"}"#).unwrap(),
        ("hi".into(), false, false)
    );
    assert_eq!(
        parse_tokenize(br#"{"content":"hi","add_special":true,"with_pieces":true}"#).unwrap(),
        ("hi".into(), true, true)
    );
    assert_eq!(
        parse_tokenize(br#"{"text":"hi"}"#)
            .unwrap_err()
            .param
            .as_deref(),
        Some("content")
    );
    assert_eq!(
        parse_detokenize(br#"{"tokens":[2,3]}"#, &limits()).unwrap(),
        vec![2, 3]
    );
    assert!(parse_detokenize(br#"{"tokens":[5000]}"#, &limits()).is_err());
    assert!(parse_detokenize(br#"{"tokens":"2"}"#, &limits()).is_err());
}

#[test]
fn structured_fields_and_tool_messages_parse() {
    let r = chat(
        r#"{"messages":[{"role":"user","content":"w?"},
            {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
              "function":{"name":"w","arguments":"{\"city\":\"Paris\"}"}}]},
            {"role":"tool","tool_call_id":"c1","content":"sunny"}],
           "tools":[{"type":"function","function":{"name":"w","parameters":{"type":"object"}}}],
           "tool_choice":"required","reasoning_effort":"low"}"#,
    )
    .unwrap();
    let PromptInput::Chat(m) = &r.prompt else {
        panic!("not chat")
    };
    assert_eq!(m[1].tool_calls[0].arguments["city"], "Paris");
    assert_eq!(m[2].tool_call_id.as_deref(), Some("c1"));
    assert_eq!(
        (r.tools.len(), &r.tool_choice, r.thinking),
        (1, &ToolChoice::Required, true)
    );
    let r = chat(
        r#"{"messages":[{"role":"user"}],"response_format":{"type":"json_schema",
            "json_schema":{"name":"x","strict":true,"schema":{"type":"object"}}}}"#,
    )
    .unwrap();
    assert!(matches!(
        r.response_format,
        Some(ConstraintSpec::JsonSchema(_))
    ));
    assert!(!r.thinking);
}
