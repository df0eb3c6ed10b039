use super::*;

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
        "<|turn>system\n<|think|><turn|>\n<|turn>user\n2+2?<turn|>\n<|turn>model\n4<turn|>\n\
         <|turn>user\nand 3+3?<turn|>\n<|turn>model\n"
    );
    assert_eq!(
        t.render(&[ChatMessage::system("S"), ChatMessage::user("U")], &think)
            .unwrap(),
        "<|turn>system\n<|think|>S<turn|>\n<|turn>user\nU<turn|>\n<|turn>model\n"
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
            .render(&[ChatMessage::new("tool", "x")], &ChatOptions::default())
            .unwrap_err();
        assert!(
            matches!(err, RuntimeError::UnknownRole { index: 0, .. }),
            "{err}"
        );
    }
}
