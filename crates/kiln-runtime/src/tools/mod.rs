//! Tool calling and thinking in model replies: the functions a request
//! declares ([`ToolDef`]), the calls a model makes ([`ToolCall`]), how each
//! Gemma family writes them ([`ToolSyntax`]), the grammar that constrains
//! them ([`grammar`]), and [`ReplyParser`], which splits streamed reply
//! text into reasoning, content and calls.
//!
//! - **Gemma 4** has native syntax ([`gemma4`]): declarations in the system
//!   turn, `<|tool_call>call:NAME{…}<tool_call|>` calls with `<|"|>`
//!   strings, and a thought channel `<|channel>thought\n…<channel|>`.
//! - **Gemma 2 / 3** have none; Kiln's built-in convention (documented in
//!   the README) lists the functions as JSON in the first user turn and
//!   has the model answer with fenced blocks
//!   ```` ```tool_call\n{"name": …, "arguments": {…}}\n``` ````.

pub mod gemma4;
pub mod grammar;
mod reply;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use reply::{ReplyEvent, ReplyParser};

/// A function the model may call (OpenAI's `tools[].function`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolDef {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// A JSON schema of the arguments object (`{}` when absent).
    #[serde(default)]
    pub parameters: Value,
}

/// A call the model made, or one in a conversation's history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The id a `tool` message refers back to (empty when the model's
    /// output was just parsed: the server assigns one).
    pub id: String,
    pub name: String,
    /// The arguments object.
    pub arguments: Value,
}

/// OpenAI's shape, `{"id","type":"function","function":{"name","arguments"}}`,
/// with `arguments` an object (what chat templates iterate over).
impl Serialize for ToolCall {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde_json::json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for ToolCall {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Function {
            name: String,
            #[serde(default)]
            arguments: Value,
        }
        #[derive(Deserialize)]
        struct Shape {
            #[serde(default)]
            id: String,
            function: Function,
        }
        let s = Shape::deserialize(d)?;
        Ok(ToolCall {
            id: s.id,
            name: s.function.name,
            arguments: s.function.arguments,
        })
    }
}

/// Whether and which tool the model must call.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum ToolChoice {
    /// Text or calls, the model's pick.
    #[default]
    Auto,
    /// No calls: the reply is text.
    None,
    /// At least one call, of any declared function.
    Required,
    /// One call of this function.
    Named(String),
}

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Gemma 4's native `<|tool_call>call:NAME{…}<tool_call|>`.
    Gemma4,
    /// Kiln's convention for Gemma 2 / 3: fenced JSON blocks.
    JsonBlock,
}

impl ToolSyntax {
    /// The (open, close) markers around one call.
    pub fn markers(self) -> (&'static str, &'static str) {
        match self {
            ToolSyntax::Gemma4 => (gemma4::CALL_OPEN, gemma4::CALL_CLOSE),
            ToolSyntax::JsonBlock => (JSON_CALL_OPEN, JSON_CALL_CLOSE),
        }
    }

    /// Parses one call's text between the markers.
    pub fn parse_call(self, body: &str) -> Result<(String, Value), String> {
        match self {
            ToolSyntax::Gemma4 => gemma4::parse_call(body).map_err(|e| e.to_string()),
            ToolSyntax::JsonBlock => {
                let v: Value =
                    serde_json::from_str(body).map_err(|e| format!("malformed tool call: {e}"))?;
                match (v.get("name").and_then(Value::as_str), v.get("arguments")) {
                    (Some(name), Some(args)) if args.is_object() => {
                        Ok((name.to_string(), args.clone()))
                    }
                    _ => Err(
                        "malformed tool call: expected {\"name\": …, \"arguments\": {…}}".into(),
                    ),
                }
            }
        }
    }

    /// Writes one call as the model would.
    pub fn format_call(self, name: &str, arguments: &Value, out: &mut String) {
        match self {
            ToolSyntax::Gemma4 => gemma4::format_call(name, arguments, out),
            ToolSyntax::JsonBlock => {
                out.push_str(JSON_CALL_OPEN);
                let call = serde_json::json!({"name": name, "arguments": arguments});
                out.push_str(&compact_json(&call));
                out.push_str(JSON_CALL_CLOSE);
            }
        }
    }
}

/// The Gemma 2 / 3 convention's call block.
pub const JSON_CALL_OPEN: &str = "```tool_call\n";
pub const JSON_CALL_CLOSE: &str = "\n```";

/// JSON with `": "` and `", "` separators (what constrained JSON output
/// looks like).
pub fn compact_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let items: Vec<String> = m
                .iter()
                .map(|(k, x)| format!("{}: {}", Value::String(k.clone()), compact_json(x)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(compact_json).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

/// The Gemma 2 / 3 convention's instructions, with the declared
/// functions as one JSON object per line.
pub fn json_block_instructions(tools: &[ToolDef]) -> String {
    let mut out = String::from("You can call these functions:\n");
    for t in tools {
        let decl = serde_json::json!({
            "name": t.name, "description": t.description, "parameters": t.parameters,
        });
        out.push_str(&compact_json(&decl));
        out.push('\n');
    }
    out.push_str(
        "To call functions, reply with one block per call and nothing else:\n\
         ```tool_call\n{\"name\": \"NAME\", \"arguments\": {…}}\n```",
    );
    out
}

/// A tool result in the Gemma 2 / 3 convention (a user turn's text).
pub fn json_block_response(name: &str, content: &str) -> String {
    let v = serde_json::json!({"name": name, "content": content});
    format!("```tool_response\n{}\n```", compact_json(&v))
}
