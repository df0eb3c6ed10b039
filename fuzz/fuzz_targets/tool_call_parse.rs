//! Gemma 4 tool-call parsing on arbitrary text: `parse_call`, and the reply
//! splitter fed the text in pieces (split where the first byte says):
//! errors are fine, panics are not.
#![no_main]

use kiln_runtime::tools::{gemma4, ReplyParser, ToolSyntax};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    let _ = gemma4::parse_call(&text);
    let _ = gemma4::parse_value(&text);
    for syntax in [ToolSyntax::Gemma4, ToolSyntax::JsonBlock] {
        let mut p = ReplyParser::new(Some(syntax), true);
        let step = usize::from(split % 16) + 1;
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(step) {
            let _ = p.push(&piece.iter().collect::<String>());
        }
        let _ = p.finish();
    }
});
