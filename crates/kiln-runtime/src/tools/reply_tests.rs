use serde_json::json;

use super::*;

fn call(name: &str, args: serde_json::Value) -> ReplyEvent {
    ReplyEvent::ToolCall(ToolCall {
        id: String::new(),
        name: name.into(),
        arguments: args,
    })
}

/// Feeds `text` in pieces of `n` chars, then finishes; merges adjacent
/// text events so results compare independently of the split.
fn split(p: &mut ReplyParser, text: &str, n: usize) -> Vec<ReplyEvent> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    for piece in chars.chunks(n) {
        out.extend(p.push(&piece.iter().collect::<String>()));
    }
    out.extend(p.finish());
    let mut merged: Vec<ReplyEvent> = Vec::new();
    for ev in out {
        match (merged.last_mut(), ev) {
            (Some(ReplyEvent::Content(a)), ReplyEvent::Content(b))
            | (Some(ReplyEvent::Reasoning(a)), ReplyEvent::Reasoning(b)) => a.push_str(&b),
            (_, ev) => merged.push(ev),
        }
    }
    merged
}

#[test]
fn thoughts_content_and_calls_split_at_any_piece_boundary() {
    let text = "<|channel>thought\nuse the tool<channel|>Let me check.\
                <|tool_call>call:w{city:<|\"|>Paris<|\"|>}<tool_call|>\
                <|tool_call>call:t{n:2}<tool_call|>";
    for n in [1, 2, 3, 5, 7, 1000] {
        let mut p = ReplyParser::new(Some(ToolSyntax::Gemma4), true);
        assert_eq!(
            split(&mut p, text, n),
            vec![
                ReplyEvent::Reasoning("use the tool".into()),
                ReplyEvent::Content("Let me check.".into()),
                call("w", json!({"city": "Paris"})),
                call("t", json!({"n": 2})),
            ],
            "pieces of {n}"
        );
        assert_eq!(p.n_calls(), 2);
    }
}

#[test]
fn malformed_or_unfinished_calls_come_back_as_content() {
    let mut p = ReplyParser::new(Some(ToolSyntax::Gemma4), true);
    let bad = "<|tool_call>call:w{city:Paris}<tool_call|>";
    assert_eq!(split(&mut p, bad, 4), vec![ReplyEvent::Content(bad.into())]);
    let mut p = ReplyParser::new(Some(ToolSyntax::Gemma4), true);
    let cut = "ok <|tool_call>call:w{city:<|\"|>Pa";
    assert_eq!(split(&mut p, cut, 3), vec![ReplyEvent::Content(cut.into())]);
    // A marker prefix at the very end is text.
    let mut p = ReplyParser::new(Some(ToolSyntax::Gemma4), true);
    assert_eq!(
        split(&mut p, "a <|tool", 2),
        vec![ReplyEvent::Content("a <|tool".into())]
    );
}

#[test]
fn without_tools_or_thoughts_markers_are_content() {
    let text = "<|channel>thought\nx<channel|>y<|tool_call>call:f{}<tool_call|>";
    let mut p = ReplyParser::new(None, false);
    assert_eq!(
        split(&mut p, text, 3),
        vec![ReplyEvent::Content(text.into())]
    );
    let mut p = ReplyParser::new(None, true);
    assert_eq!(
        split(&mut p, text, 3),
        vec![
            ReplyEvent::Reasoning("x".into()),
            ReplyEvent::Content("y<|tool_call>call:f{}<tool_call|>".into())
        ]
    );
}

#[test]
fn json_blocks_parse_in_the_gemma3_convention() {
    let text = "```tool_call\n{\"name\": \"f\", \"arguments\": {\"a\": [1]}}\n```\n\
                ```tool_call\n{\"name\": \"g\", \"arguments\": {}}\n```";
    let mut p = ReplyParser::new(Some(ToolSyntax::JsonBlock), false);
    assert_eq!(
        split(&mut p, text, 4),
        vec![call("f", json!({"a": [1]})), call("g", json!({}))]
    );
}

#[test]
fn an_unclosed_thought_is_all_reasoning() {
    let mut p = ReplyParser::new(None, true);
    assert_eq!(
        split(&mut p, "<|channel>thought\nhmm <chan", 2),
        vec![ReplyEvent::Reasoning("hmm <chan".into())]
    );
    let mut p = ReplyParser::new(None, true);
    assert_eq!(
        split(&mut p, "<|channel>tho", 2),
        vec![ReplyEvent::Reasoning("tho".into())]
    );
}
