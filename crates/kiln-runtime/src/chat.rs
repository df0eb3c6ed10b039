//! Chat prompts: a conversation (`[{role, content}]`) rendered to prompt text,
//! either with the GGUF's `tokenizer.chat_template` (Jinja, rendered as HF
//! transformers does) or with a built-in Gemma format (GEMMA.md §2.3).
//!
//! **BOS.** Gemma templates start with `{{ bos_token }}`, and Gemma
//! tokenizers also add BOS when encoding. To avoid a double BOS (which
//! llama.cpp warns about and which shifts the model's input), the rendered
//! text loses one leading BOS string when [`ChatOptions::tokenizer_adds_bos`]
//! is true (the default). Encode the result with `add_bos = true` and
//! `parse_special = true`.

use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};
use crate::tools::{
    gemma4, json_block_instructions, json_block_response, ToolCall, ToolDef, ToolSyntax,
};

/// One turn of a conversation.
///
/// ```
/// use kiln_runtime::ChatMessage;
/// let m: ChatMessage = serde_json::from_str(r#"{"role":"user","content":"Hi"}"#).unwrap();
/// assert_eq!(m, ChatMessage::user("Hi"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool` (a function's result).
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant turn's function calls.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
    /// A `tool` message: the result of call `call_id` of function `name`.
    pub fn tool(
        call_id: impl Into<String>,
        name: impl Into<String>,
        content: impl Into<String>,
    ) -> Self {
        ChatMessage {
            tool_call_id: Some(call_id.into()),
            name: Some(name.into()),
            ..Self::new("tool", content)
        }
    }
    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    /// An assistant (model) message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// How to render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatOptions {
    /// End with the opening of a model turn (default true).
    pub add_generation_prompt: bool,
    /// Gemma 4 thinking mode: `<|think|>` at the top of the system turn
    /// (passed to Jinja templates as `enable_thinking`). Default false.
    pub enable_thinking: bool,
    /// The tokenizer will add BOS itself: drop a leading BOS from the render
    /// (default true; see the module docs).
    pub tokenizer_adds_bos: bool,
    /// Functions the model may call, declared in the prompt (passed to Jinja
    /// templates as `tools`, in OpenAI's shape).
    pub tools: Vec<ToolDef>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            add_generation_prompt: true,
            enable_thinking: false,
            tokenizer_adds_bos: true,
            tools: Vec::new(),
        }
    }
}

/// The formats a [`ChatTemplate`] can render.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatFormat {
    /// The file's Jinja template.
    Jinja,
    /// Built-in Gemma 2 / 3 turns (`<start_of_turn>…<end_of_turn>`), system
    /// prompt folded into the first user turn.
    Gemma,
    /// Built-in Gemma 4 turns (`<|turn>…<turn|>`) with a real system turn.
    Gemma4,
}

/// A compiled chat template.
///
/// ```
/// use kiln_runtime::{ChatMessage, ChatOptions, ChatTemplate};
/// let t = ChatTemplate::gemma4();
/// let text = t
///     .render(&[ChatMessage::system("Be brief."), ChatMessage::user("Hi")], &ChatOptions::default())
///     .unwrap();
/// assert_eq!(text, "<|turn>system\nBe brief.<turn|>\n<|turn>user\nHi<turn|>\n<|turn>model\n");
///
/// let jinja = ChatTemplate::from_jinja(
///     "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content.strip() }}\n{% endfor %}",
///     "<bos>",
///     "<eos>",
/// )
/// .unwrap();
/// let opts = ChatOptions { tokenizer_adds_bos: false, ..Default::default() };
/// assert_eq!(jinja.render(&[ChatMessage::user("  yo ")], &opts).unwrap(), "<bos>[user] yo\n");
/// ```
#[derive(Debug)]
pub struct ChatTemplate {
    format: ChatFormat,
    /// The built-in format of the model's family (`Gemma` or `Gemma4`):
    /// its tool syntax, and the renderer for conversations with tools when
    /// a Jinja template does not handle them.
    family: ChatFormat,
    /// The Jinja template mentions `tools` (renders declarations itself).
    jinja_tools: bool,
    /// Holds the compiled template named `chat` for [`ChatFormat::Jinja`].
    env: Option<Environment<'static>>,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles a Jinja chat template. `bos_token` / `eos_token` are the
    /// strings the template sees as `bos_token` / `eos_token`.
    pub fn from_jinja(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        // The options transformers uses for chat templates
        // (`ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        // Python string/dict methods (`.strip()`, `.startswith()`, `.items()`).
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            format: ChatFormat::Jinja,
            family: if source.contains("<|turn>") {
                ChatFormat::Gemma4
            } else {
                ChatFormat::Gemma
            },
            jinja_tools: source.contains("tools"),
            env: Some(env),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The built-in Gemma 2 / 3 format.
    pub fn gemma() -> Self {
        Self::builtin(ChatFormat::Gemma)
    }

    /// The built-in Gemma 4 format.
    pub fn gemma4() -> Self {
        Self::builtin(ChatFormat::Gemma4)
    }

    fn builtin(format: ChatFormat) -> Self {
        ChatTemplate {
            format,
            family: format,
            jinja_tools: false,
            env: None,
            bos_token: "<bos>".into(),
            eos_token: "<eos>".into(),
        }
    }

    /// The file's `tokenizer.chat_template` when it has one, else the
    /// built-in format of its architecture (`gemma4` → Gemma 4, `gemma`,
    /// `gemma2`, `gemma3` → Gemma 2/3). BOS/EOS strings come from the vocab.
    pub fn from_gguf(gguf: &kiln_gguf::Gguf) -> Result<Self> {
        let token_text = |key: &str, fallback: &str| -> String {
            let id = gguf.get(key).and_then(|v| v.as_u64());
            let tokens = gguf.get_str_array("tokenizer.ggml.tokens").ok();
            match (id, tokens) {
                (Some(id), Some(tokens)) => tokens.get(id as usize).unwrap_or(fallback).to_string(),
                _ => fallback.to_string(),
            }
        };
        let bos = token_text("tokenizer.ggml.bos_token_id", "<bos>");
        let eos = token_text("tokenizer.ggml.eos_token_id", "<eos>");
        let arch = gguf.architecture()?;
        if let Some(source) = gguf.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
            let mut t = Self::from_jinja(source, &bos, &eos)?;
            if arch == "gemma4" {
                t.family = ChatFormat::Gemma4;
            }
            return Ok(t);
        }
        let format = match arch {
            "gemma4" => ChatFormat::Gemma4,
            "gemma" | "gemma2" | "gemma3" => ChatFormat::Gemma,
            other => {
                return Err(RuntimeError::Template(format!(
                    "the file has no tokenizer.chat_template and there is no built-in format for architecture {other:?}"
                )))
            }
        };
        Ok(ChatTemplate {
            bos_token: bos,
            eos_token: eos,
            ..Self::builtin(format)
        })
    }

    /// Which format this template renders.
    pub fn format(&self) -> ChatFormat {
        self.format
    }

    /// How the model writes tool calls: Gemma 4's native syntax, or Kiln's
    /// JSON-block convention for Gemma 2 / 3.
    pub fn tool_syntax(&self) -> ToolSyntax {
        match self.family {
            ChatFormat::Gemma4 => ToolSyntax::Gemma4,
            _ => ToolSyntax::JsonBlock,
        }
    }

    /// Renders `messages` into prompt text (see the module docs on BOS).
    /// Tools, tool calls and `tool` messages go through the Jinja template
    /// when it handles tools, else through the family's built-in format.
    pub fn render(&self, messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
        let uses_tools = !opts.tools.is_empty()
            || messages
                .iter()
                .any(|m| m.role == "tool" || !m.tool_calls.is_empty());
        let format = match self.format {
            ChatFormat::Jinja if uses_tools && !self.jinja_tools => self.family,
            f => f,
        };
        let text = match (format, &self.env) {
            (ChatFormat::Jinja, Some(env)) => self.render_jinja(env, messages, opts)?,
            (ChatFormat::Gemma4, _) => render_gemma4(messages, opts)?,
            // `Jinja` always carries its environment; `Gemma` never needs one.
            _ => render_gemma(messages, opts)?,
        };
        Ok(if opts.tokenizer_adds_bos {
            match text.strip_prefix(self.bos_token.as_str()) {
                Some(rest) if !self.bos_token.is_empty() => rest.to_string(),
                _ => text,
            }
        } else {
            text
        })
    }

    fn render_jinja(
        &self,
        env: &Environment<'static>,
        messages: &[ChatMessage],
        opts: &ChatOptions,
    ) -> Result<String> {
        let tmpl = env.get_template(TEMPLATE_NAME).map_err(template_error)?;
        // OpenAI's shape, which templates iterate over; none when empty.
        let tools: Option<Vec<serde_json::Value>> = (!opts.tools.is_empty()).then(|| {
            opts.tools
                .iter()
                .map(|t| serde_json::json!({"type": "function", "function": t}))
                .collect()
        });
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => tools,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            add_generation_prompt => opts.add_generation_prompt,
            enable_thinking => opts.enable_thinking,
        })
        .map_err(template_error)
    }
}

fn template_error(e: minijinja::Error) -> RuntimeError {
    // `{:#}` includes the template line and the cause chain.
    RuntimeError::Template(format!("{e:#}"))
}

/// Gemma 2 / 3 (llama.cpp `LLM_CHAT_TEMPLATE_GEMMA`): no system role, so the
/// system text (trimmed) opens the next user turn followed by a blank line;
/// `assistant` is spelled `model`; contents are trimmed.
///
/// Tools follow Kiln's convention ([`crate::tools`]): the declarations and
/// instructions join the system text, an assistant's calls are fenced
/// `tool_call` blocks, and `tool` messages become a user turn of
/// `tool_response` blocks.
fn render_gemma(messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
    let mut out = String::from("<bos>");
    let mut system = String::new();
    if !opts.tools.is_empty() {
        system = json_block_instructions(&opts.tools);
    }
    let mut prev_tool = false;
    for (index, m) in messages.iter().enumerate() {
        let role = match m.role.as_str() {
            "system" => {
                if !system.is_empty() {
                    system.insert_str(0, "\n\n");
                }
                system.insert_str(0, m.content.trim());
                continue;
            }
            "user" | "tool" => "user",
            "assistant" | "model" => "model",
            other => {
                return Err(RuntimeError::UnknownRole {
                    index,
                    role: other.to_string(),
                })
            }
        };
        let tool = m.role == "tool";
        if tool && prev_tool {
            // Consecutive results share one user turn.
            out.truncate(out.len() - "<end_of_turn>\n".len());
            out.push('\n');
        } else {
            out.push_str("<start_of_turn>");
            out.push_str(role);
            out.push('\n');
        }
        prev_tool = tool;
        if role == "user" && !system.is_empty() {
            out.push_str(&system);
            out.push_str("\n\n");
            system.clear();
        }
        if tool {
            out.push_str(&json_block_response(
                m.name.as_deref().unwrap_or_default(),
                &m.content,
            ));
        } else {
            out.push_str(m.content.trim());
        }
        for (i, c) in m.tool_calls.iter().enumerate() {
            if i > 0 || !m.content.trim().is_empty() {
                out.push('\n');
            }
            ToolSyntax::JsonBlock.format_call(&c.name, &c.arguments, &mut out);
        }
        out.push_str("<end_of_turn>\n");
    }
    // A system prompt with no user turn after it still reaches the model.
    if !system.is_empty() {
        out.push_str("<start_of_turn>user\n");
        out.push_str(&system);
        out.push_str("<end_of_turn>\n");
    }
    if opts.add_generation_prompt {
        out.push_str("<start_of_turn>model\n");
    }
    Ok(out)
}

/// Gemma 4, as its official template renders: a system turn when there
/// is a system message, thinking (`<|think|>` first) or tools (their
/// declarations last); assistant history keeps only the final answer
/// (thought channels stripped, GEMMA.md §2.3); an assistant's calls are
/// followed by the `tool` messages answering them as tool responses, in
/// the same model turn, and a prompt that ends in a tool response
/// continues that turn (no new `<|turn>model`).
fn render_gemma4(messages: &[ChatMessage], opts: &ChatOptions) -> Result<String> {
    let mut out = String::from("<bos>");
    let mut rest = messages;
    let first_system = messages.first().filter(|m| m.role == "system");
    if opts.enable_thinking || !opts.tools.is_empty() || first_system.is_some() {
        out.push_str("<|turn>system\n");
        if opts.enable_thinking {
            out.push_str("<|think|>\n");
        }
        if let Some(m) = first_system {
            out.push_str(m.content.trim());
            rest = &messages[1..];
        }
        for t in &opts.tools {
            gemma4::declaration(t, &mut out);
        }
        out.push_str("<turn|>\n");
    }
    let offset = messages.len() - rest.len();
    // Whether the prompt ends inside a model turn (after calls/results).
    let mut open_turn = false;
    let mut prev_role: Option<&str> = None;
    let mut i = 0;
    while i < rest.len() {
        let m = &rest[i];
        let index = offset + i;
        i += 1;
        let role = match m.role.as_str() {
            "system" => "system",
            "user" => "user",
            "assistant" | "model" => "model",
            // A result without a call before it: a response block of its own.
            "tool" => "tool",
            other => {
                return Err(RuntimeError::UnknownRole {
                    index,
                    role: other.to_string(),
                })
            }
        };
        if role == "tool" {
            if !open_turn {
                out.push_str("<|turn>model\n");
            }
            gemma4::format_response(m.name.as_deref().unwrap_or("unknown"), &m.content, &mut out);
            open_turn = true;
            continue;
        }
        // Consecutive assistant messages continue one model turn.
        if !(role == "model" && prev_role == Some("model")) {
            out.push_str("<|turn>");
            out.push_str(role);
            out.push('\n');
        }
        prev_role = Some(role);
        open_turn = false;
        for c in &m.tool_calls {
            gemma4::format_call(&c.name, &c.arguments, &mut out);
        }
        let mut answered = false;
        while let Some(t) = rest
            .get(i)
            .filter(|t| t.role == "tool" && !m.tool_calls.is_empty())
        {
            let name = m
                .tool_calls
                .iter()
                .find(|c| Some(&c.id) == t.tool_call_id.as_ref())
                .map(|c| c.name.as_str())
                .or(t.name.as_deref())
                .unwrap_or("unknown");
            gemma4::format_response(name, &t.content, &mut out);
            answered = true;
            i += 1;
        }
        let content = if role == "model" {
            strip_thoughts(&m.content).trim().to_string()
        } else {
            m.content.trim().to_string()
        };
        out.push_str(&content);
        if !m.tool_calls.is_empty() && !answered {
            out.push_str("<|tool_response>");
            open_turn = true;
        } else if answered && content.is_empty() {
            open_turn = true;
        } else {
            out.push_str("<turn|>\n");
        }
    }
    if opts.add_generation_prompt && !open_turn {
        out.push_str("<|turn>model\n");
    }
    Ok(out)
}

/// Removes every `<|channel>…<channel|>` block (an unterminated one runs to
/// the end of the text).
fn strip_thoughts(text: &str) -> String {
    const OPEN: &str = "<|channel>";
    const CLOSE: &str = "<channel|>";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        let after = &rest[start + OPEN.len()..];
        rest = match after.find(CLOSE) {
            Some(end) => &after[end + CLOSE.len()..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[path = "chat_tests.rs"]
mod tests;
