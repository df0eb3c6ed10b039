//! Arbitrary conversations through the chat-template renderer: the
//! built-in Gemma 2/3 and Gemma 4 formats and the Jinja templates of the
//! fixture GGUFs (`$KILN_SHARED_DIR`, default `../shared`). Rendering may
//! refuse (an unknown role, a template's raise_exception) but never
//! panics, and a rendered built-in prompt holds every system and user
//! message's (trimmed) text.
//!
//! Input: messages separated by 0xFF bytes; each message's first byte
//! picks its role, the rest (lossy UTF-8) is its content.
#![no_main]

use std::sync::OnceLock;

use kiln_gguf::Gguf;
use kiln_runtime::{ChatMessage, ChatOptions, ChatTemplate};
use libfuzzer_sys::fuzz_target;

fn templates() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let shared = std::env::var("KILN_SHARED_DIR")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared").into());
        let mut t = vec![ChatTemplate::gemma(), ChatTemplate::gemma4()];
        for m in ["gemma3-tiny", "gemma4-tiny"] {
            let path = format!("{shared}/fixtures/{m}/model-f32.gguf");
            let g = Gguf::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
            t.push(ChatTemplate::from_gguf(&g).expect("fixture chat template compiles"));
        }
        t
    })
}

const ROLES: [&str; 5] = ["system", "user", "assistant", "tool", ""];

fuzz_target!(|data: &[u8]| {
    let messages: Vec<ChatMessage> = data
        .split(|&b| b == 0xFF)
        .filter_map(|m| {
            let (&role, content) = m.split_first()?;
            Some(ChatMessage::new(
                ROLES[role as usize % ROLES.len()],
                String::from_utf8_lossy(content),
            ))
        })
        .collect();
    for (i, t) in templates().iter().enumerate() {
        for (bos, gen) in [(true, true), (false, false)] {
            let opts = ChatOptions {
                add_generation_prompt: gen,
                tokenizer_adds_bos: bos,
                ..Default::default()
            };
            let Ok(text) = t.render(&messages, &opts) else {
                continue;
            };
            if i < 2 {
                // Assistant turns may lose thought channels (Gemma 4).
                // Tool results are rendered as JSON strings (escaped).
                for m in messages.iter().filter(|m| m.role != "assistant") {
                    let c = m.content.trim();
                    let json = serde_json::to_string(c).unwrap_or_default();
                    let escaped = json.trim_matches('"');
                    assert!(
                        text.contains(c) || text.contains(escaped),
                        "{:?} lost {:?}",
                        text,
                        m.content
                    );
                }
            }
        }
    }
});
