use super::*;
use crate::tools::{ToolCall, ToolDef, ToolSyntax};

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system(" You are terse. "),
        ChatMessage::user("Hi"),
        ChatMessage::assistant("Hello!"),
        ChatMessage::user(" How are you? "),
    ]
}

fn keep_bos() -> ChatOptions {
    ChatOptions {
        tokenizer_adds_bos: false,
        ..Default::default()
    }
}

#[test]
fn fixture_jinja_template_matches_transformers() {
    let src =
        std::fs::read_to_string(kiln_testdata::fixture("tokenizer/chat_template.jinja")).unwrap();
    let t = ChatTemplate::from_jinja(&src, "<bos>", "<eos>").unwrap();
    let msgs = &conversation()[1..];
    // Expected strings rendered by Python jinja2 with transformers' options.
    assert_eq!(
        t.render(msgs, &keep_bos()).unwrap(),
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n"
    );
    let no_gen = ChatOptions {
        add_generation_prompt: false,
        ..Default::default()
    };
    assert_eq!(
        t.render(
            &[ChatMessage::system("Sys"), ChatMessage::user("Hi")],
            &no_gen
        )
        .unwrap(),
        "<start_of_turn>system\nSys<end_of_turn>\n<start_of_turn>user\nHi<end_of_turn>\n"
    );
}

#[test]
fn from_gguf_reads_the_files_template_and_bos() {
    let g = kiln_gguf::Gguf::open(kiln_testdata::fixture("gemma3-tiny/model-f32.gguf")).unwrap();
    let t = ChatTemplate::from_gguf(&g).unwrap();
    assert_eq!(t.format(), ChatFormat::Jinja);
    assert_eq!(
        t.render(&[ChatMessage::user("Hi")], &ChatOptions::default())
            .unwrap(),
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn builtin_gemma_folds_system_into_first_user_turn() {
    let t = ChatTemplate::gemma();
    assert_eq!(
        t.render(&conversation(), &keep_bos()).unwrap(),
        "<bos><start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nHow are you?<end_of_turn>\n<start_of_turn>model\n"
    );
    // Default options drop the BOS the tokenizer will add.
    assert_eq!(
        t.render(&[ChatMessage::user("Hi")], &ChatOptions::default())
            .unwrap(),
        "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    // A lone system prompt still reaches the model as a user turn.
    assert_eq!(
        t.render(&[ChatMessage::system("S")], &ChatOptions::default())
            .unwrap(),
        "<start_of_turn>user\nS<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn builtin_gemma4_has_a_system_turn_and_strips_thoughts() {
    let t = ChatTemplate::gemma4();
    assert_eq!(
        t.render(&conversation(), &keep_bos()).unwrap(),
        "<bos><|turn>system\nYou are terse.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\nHello!<turn|>\n\
         <|turn>user\nHow are you?<turn|>\n<|turn>model\n"
    );
    let msgs = [
        ChatMessage::user("2+2?"),
        ChatMessage::assistant("<|channel>thought\nadd them<channel|>4"),
        ChatMessage::user("and 3+3?"),
    ];
    let think = ChatOptions {
        enable_thinking: true,
        ..Default::default()
    };
    assert_eq!(
        t.render(&msgs, &think).unwrap(),
        "<|turn>system\n<|think|>\n<turn|>\n<|turn>user\n2+2?<turn|>\n<|turn>model\n4<turn|>\n\
         <|turn>user\nand 3+3?<turn|>\n<|turn>model\n"
    );
    assert_eq!(
        t.render(&[ChatMessage::system("S"), ChatMessage::user("U")], &think)
            .unwrap(),
        "<|turn>system\n<|think|>\nS<turn|>\n<|turn>user\nU<turn|>\n<|turn>model\n"
    );
}

#[test]
fn gemma4_reference_prompt() {
    // GEMMA.md §2.3 reference text (ids given there are for this string + BOS).
    let t = ChatTemplate::gemma4();
    assert_eq!(
        t.render(
            &[ChatMessage::user("What is the capital of France?")],
            &ChatOptions::default()
        )
        .unwrap(),
        "<|turn>user\nWhat is the capital of France?<turn|>\n<|turn>model\n"
    );
}

#[test]
fn raise_exception_and_pycompat_methods() {
    let src = "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}\
               {% for m in messages %}{{ m['content'].strip().upper() }}{% if m.content.strip().startswith('x') %}!{% endif %}\n{% endfor %}";
    let t = ChatTemplate::from_jinja(src, "<bos>", "<eos>").unwrap();
    let err = t
        .render(&conversation(), &ChatOptions::default())
        .unwrap_err();
    assert!(
        err.to_string().contains("System role not supported"),
        "{err}"
    );
    assert_eq!(
        t.render(
            &[ChatMessage::user(" xy "), ChatMessage::assistant("b")],
            &ChatOptions::default()
        )
        .unwrap(),
        // trim_blocks eats the newline after `{% endif %}`, as in jinja2.
        "XY!B"
    );
}

#[test]
fn bad_templates_and_roles_are_errors() {
    assert!(matches!(
        ChatTemplate::from_jinja("{% for %}", "<bos>", "<eos>"),
        Err(RuntimeError::Template(_))
    ));
    let undefined_method = ChatTemplate::from_jinja("{{ messages.nope() }}", "", "").unwrap();
    assert!(undefined_method
        .render(&[], &ChatOptions::default())
        .is_err());
    for t in [ChatTemplate::gemma(), ChatTemplate::gemma4()] {
        let err = t
            .render(
                &[ChatMessage::new("narrator", "x")],
                &ChatOptions::default(),
            )
            .unwrap_err();
        assert!(
            matches!(err, RuntimeError::UnknownRole { index: 0, .. }),
            "{err}"
        );
    }
}

fn weather_tool() -> ToolDef {
    ToolDef {
        name: "weather".into(),
        description: "Weather".into(),
        parameters: serde_json::json!({"type": "object",
            "properties": {"city": {"type": "string", "description": "City"}},
            "required": ["city"]}),
    }
}

fn round_trip() -> Vec<ChatMessage> {
    let call = ToolCall {
        id: "call_1".into(),
        name: "weather".into(),
        arguments: serde_json::json!({"city": "Paris"}),
    };
    vec![
        ChatMessage::user("Plan"),
        ChatMessage {
            tool_calls: vec![call],
            ..ChatMessage::assistant("")
        },
        ChatMessage::tool("call_1", "weather", "sunny"),
    ]
}

#[test]
fn gemma4_tool_round_trip_matches_the_official_template() {
    // The official template's rendering of this conversation (thinking on).
    let opts = ChatOptions {
        enable_thinking: true,
        tools: vec![weather_tool()],
        ..keep_bos()
    };
    assert_eq!(
        ChatTemplate::gemma4().render(&round_trip(), &opts).unwrap(),
        "<bos><|turn>system\n<|think|>\n\
         <|tool>declaration:weather{description:<|\"|>Weather<|\"|>,parameters:{\
         properties:{city:{description:<|\"|>City<|\"|>,type:<|\"|>STRING<|\"|>}},\
         required:[<|\"|>city<|\"|>],type:<|\"|>OBJECT<|\"|>}}<tool|><turn|>\n\
         <|turn>user\nPlan<turn|>\n<|turn>model\n\
         <|tool_call>call:weather{city:<|\"|>Paris<|\"|>}<tool_call|>\
         <|tool_response>response:weather{value:<|\"|>sunny<|\"|>}<tool_response|>"
    );
    // A final answer after the results closes the turn.
    let mut msgs = round_trip();
    msgs.push(ChatMessage::assistant("It is sunny."));
    msgs.push(ChatMessage::user("Thanks"));
    let text = ChatTemplate::gemma4()
        .render(&msgs, &ChatOptions::default())
        .unwrap();
    assert!(
        text.ends_with(
            "<tool_response|>It is sunny.<turn|>\n<|turn>user\nThanks<turn|>\n<|turn>model\n"
        ),
        "{text}"
    );
}

#[test]
fn gemma3_tools_use_the_json_block_convention() {
    let opts = ChatOptions {
        tools: vec![weather_tool()],
        ..ChatOptions::default()
    };
    let text = ChatTemplate::gemma().render(&round_trip(), &opts).unwrap();
    assert!(
        text.starts_with(
            "<start_of_turn>user\nYou can call these functions:\n{\"name\": \"weather\""
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "<start_of_turn>model\n```tool_call\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}\n```<end_of_turn>\n\
             <start_of_turn>user\n```tool_response\n{\"name\": \"weather\", \"content\": \"sunny\"}\n```<end_of_turn>\n\
             <start_of_turn>model\n"
        ),
        "{text}"
    );
}

#[test]
fn jinja_templates_without_tools_fall_back_to_the_family_format() {
    let g = kiln_gguf::Gguf::open(kiln_testdata::fixture("gemma4-tiny/model-f32.gguf")).unwrap();
    let t = ChatTemplate::from_gguf(&g).unwrap();
    assert_eq!(t.format(), ChatFormat::Jinja);
    assert_eq!(t.tool_syntax(), ToolSyntax::Gemma4);
    let opts = ChatOptions {
        tools: vec![weather_tool()],
        ..ChatOptions::default()
    };
    let text = t.render(&[ChatMessage::user("Hi")], &opts).unwrap();
    assert!(
        text.starts_with("<|turn>system\n<|tool>declaration:weather"),
        "{text}"
    );
    // A template that handles tools gets them in OpenAI's shape.
    let j = ChatTemplate::from_jinja(
        "{% for t in tools %}{{ t.function.name }}:{{ t.type }};{% endfor %}\
         {% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments.city }}{% endfor %}{% endfor %}",
        "",
        "",
    )
    .unwrap();
    assert_eq!(
        j.render(&round_trip(), &opts).unwrap(),
        "weather:function;Paris"
    );
}
