//! Gemma 4's tool syntax (GEMMA.md §2.3), as its chat template writes it:
//! values are JSON-like with bare keys and `<|"|>` string delimiters
//! (`{city:<|"|>Paris<|"|>,days:3,metric:true}`), calls are
//! `<|tool_call>call:NAME{…}<tool_call|>`, results
//! `<|tool_response>response:NAME{value:…}<tool_response|>`, declarations
//! `<|tool>declaration:NAME{description:…,parameters:{…}}<tool|>`.
//!
//! [`format_value`] and [`declaration`] follow the template's
//! `format_argument` and `format_function_declaration` macros (keys sorted
//! case-insensitively, types upper-cased); [`parse_value`] reads what the
//! model writes back, leniently (JSON `"strings"`, quoted keys, spaces and
//! `None` are accepted too) and never panics.

use serde_json::{Map, Number, Value};

use super::ToolDef;

/// The string delimiter token's text.
pub const QUOTE: &str = "<|\"|>";
pub const CALL_OPEN: &str = "<|tool_call>";
pub const CALL_CLOSE: &str = "<tool_call|>";

/// Keys in the order Jinja's `dictsort` gives (case-insensitive).
fn sorted(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut v: Vec<_> = m.iter().collect();
    v.sort_by_key(|(k, _)| k.to_lowercase());
    v
}

/// `format_argument(value, escape_keys)`: strings quoted with `<|"|>`,
/// keys quoted only with `escape_keys`, `null` as Python's `None`.
pub fn format_value(v: &Value, escape_keys: bool, out: &mut String) {
    match v {
        Value::String(s) => {
            out.push_str(QUOTE);
            out.push_str(s);
            out.push_str(QUOTE);
        }
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Null => out.push_str("None"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                format_value(x, escape_keys, out);
            }
            out.push(']');
        }
        Value::Object(m) => {
            out.push('{');
            for (i, (k, x)) in sorted(m).into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                if escape_keys {
                    out.push_str(QUOTE);
                    out.push_str(k);
                    out.push_str(QUOTE);
                } else {
                    out.push_str(k);
                }
                out.push(':');
                format_value(x, escape_keys, out);
            }
            out.push('}');
        }
    }
}

/// A call as the template renders it: `<|tool_call>call:NAME{k:v,…}<tool_call|>`.
pub fn format_call(name: &str, arguments: &Value, out: &mut String) {
    out.push_str(CALL_OPEN);
    out.push_str("call:");
    out.push_str(name);
    match arguments {
        Value::Object(_) => format_value(arguments, false, out),
        // The template writes a non-object argument string as is.
        Value::String(s) => {
            out.push('{');
            out.push_str(s);
            out.push('}');
        }
        other => {
            out.push('{');
            format_value(other, false, out);
            out.push('}');
        }
    }
    out.push_str(CALL_CLOSE);
}

/// A tool result: `<|tool_response>response:NAME{value:<|"|>…<|"|>}<tool_response|>`.
pub fn format_response(name: &str, content: &str, out: &mut String) {
    out.push_str("<|tool_response>response:");
    out.push_str(name);
    out.push_str("{value:");
    format_value(&Value::String(content.to_string()), false, out);
    out.push_str("}<tool_response|>");
}

fn upper_type(v: &Value) -> String {
    v.get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_uppercase()
}

fn quoted_list(items: &Value, out: &mut String) {
    out.push('[');
    for (i, r) in items.as_array().into_iter().flatten().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(QUOTE);
        out.push_str(r.as_str().unwrap_or_default());
        out.push_str(QUOTE);
    }
    out.push(']');
}

/// Jinja truthiness of an optional value.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Number(_)) | Some(Value::Bool(true)) => true,
    }
}

/// The template's `format_parameters(properties)` macro.
fn format_parameters(props: &Map<String, Value>, out: &mut String) {
    const STANDARD: [&str; 5] = ["description", "type", "properties", "required", "nullable"];
    let mut first = true;
    for (key, value) in sorted(props) {
        if STANDARD.contains(&key.as_str()) {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(key);
        out.push_str(":{");
        let mut comma = false;
        let mut sep = |out: &mut String| {
            if comma {
                out.push(',');
            }
            comma = true;
        };
        if let Some(d) = value.get("description").filter(|d| truthy(Some(d))) {
            sep(out);
            out.push_str("description:");
            format_value(
                &Value::String(d.as_str().unwrap_or_default().into()),
                true,
                out,
            );
        }
        let ty = upper_type(value);
        if ty == "STRING" && truthy(value.get("enum")) {
            sep(out);
            out.push_str("enum:");
            format_value(&value["enum"], true, out);
        } else if ty == "ARRAY" {
            if let Some(items) = value.get("items").and_then(Value::as_object) {
                if !items.is_empty() {
                    sep(out);
                    out.push_str("items:{");
                    format_items(items, out);
                    out.push('}');
                }
            }
        }
        if truthy(value.get("nullable")) {
            sep(out);
            out.push_str("nullable:true");
        }
        if ty == "OBJECT" {
            let inner = value.get("properties").and_then(Value::as_object);
            let inner = inner.or_else(|| value.as_object());
            if let Some(inner) = inner {
                sep(out);
                out.push_str("properties:{");
                format_parameters(inner, out);
                out.push('}');
            }
            if truthy(value.get("required")) {
                sep(out);
                out.push_str("required:");
                quoted_list(&value["required"], out);
            }
        }
        sep(out);
        out.push_str("type:");
        out.push_str(QUOTE);
        out.push_str(&ty);
        out.push_str(QUOTE);
        out.push('}');
    }
}

/// The `items:{…}` part of an array property.
fn format_items(items: &Map<String, Value>, out: &mut String) {
    let mut first = true;
    for (key, value) in sorted(items) {
        if value.is_null() {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        match key.as_str() {
            "properties" => {
                out.push_str("properties:{");
                if let Some(p) = value.as_object() {
                    format_parameters(p, out);
                }
                out.push('}');
            }
            "required" => {
                out.push_str("required:");
                quoted_list(value, out);
            }
            "type" => {
                out.push_str("type:");
                let up = match value {
                    Value::String(s) => Value::String(s.to_uppercase()),
                    Value::Array(a) => Value::Array(
                        a.iter()
                            .map(|t| Value::String(t.as_str().unwrap_or_default().to_uppercase()))
                            .collect(),
                    ),
                    other => other.clone(),
                };
                format_value(&up, true, out);
            }
            _ => {
                out.push_str(key);
                out.push(':');
                format_value(value, true, out);
            }
        }
    }
}

/// `<|tool>declaration:NAME{…}<tool|>`, as the template's
/// `format_function_declaration` writes it.
pub fn declaration(tool: &ToolDef, out: &mut String) {
    out.push_str("<|tool>declaration:");
    out.push_str(&tool.name);
    out.push_str("{description:");
    format_value(&Value::String(tool.description.clone()), true, out);
    let params = &tool.parameters;
    if truthy(Some(params)) {
        out.push_str(",parameters:{");
        if let Some(props) = params.get("properties").and_then(Value::as_object) {
            if !props.is_empty() {
                out.push_str("properties:{");
                format_parameters(props, out);
                out.push_str("},");
            }
        }
        if truthy(params.get("required")) {
            out.push_str("required:");
            quoted_list(&params["required"], out);
            out.push(',');
        }
        if truthy(params.get("type")) {
            out.push_str("type:");
            out.push_str(QUOTE);
            out.push_str(&upper_type(params));
            out.push_str(QUOTE);
            out.push('}');
        }
    }
    out.push_str("}<tool|>");
}

/// Why a call's text could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed tool call at byte {at}: {what}")]
pub struct SyntaxError {
    pub at: usize,
    pub what: &'static str,
}

/// The body of one call (between `<|tool_call>` and `<tool_call|>`):
/// `call:NAME{…}` → (NAME, arguments as a JSON object).
pub fn parse_call(body: &str) -> Result<(String, Value), SyntaxError> {
    let s = body.trim();
    let rest = s.strip_prefix("call:").ok_or(SyntaxError {
        at: 0,
        what: "expected `call:NAME{…}`",
    })?;
    let brace = rest.find('{').ok_or(SyntaxError {
        at: s.len(),
        what: "expected `{` after the function name",
    })?;
    let name = rest[..brace].trim();
    if name.is_empty() {
        return Err(SyntaxError {
            at: 5,
            what: "the function name is empty",
        });
    }
    let start = s.len() - rest.len() + brace;
    let mut p = Parser { s, at: start };
    let args = p.value(0)?;
    p.skip_ws();
    if p.at != s.len() {
        return Err(p.err("unexpected text after the arguments"));
    }
    if !args.is_object() {
        return Err(SyntaxError {
            at: start,
            what: "the arguments must be an object",
        });
    }
    Ok((name.to_string(), args))
}

/// One value in Gemma 4 syntax (the whole text).
pub fn parse_value(text: &str) -> Result<Value, SyntaxError> {
    let mut p = Parser { s: text, at: 0 };
    let v = p.value(0)?;
    p.skip_ws();
    if p.at != text.len() {
        return Err(p.err("unexpected text after the value"));
    }
    Ok(v)
}

/// Nesting limit: deeper input is an error, not a stack overflow.
const MAX_DEPTH: usize = 64;

struct Parser<'a> {
    s: &'a str,
    at: usize,
}

impl Parser<'_> {
    fn err(&self, what: &'static str) -> SyntaxError {
        SyntaxError { at: self.at, what }
    }

    fn rest(&self) -> &str {
        &self.s[self.at..]
    }

    fn skip_ws(&mut self) {
        let r = self.rest();
        self.at += r.len() - r.trim_start().len();
    }

    fn eat(&mut self, lit: &str) -> bool {
        if self.rest().starts_with(lit) {
            self.at += lit.len();
            true
        } else {
            false
        }
    }

    fn value(&mut self, depth: usize) -> Result<Value, SyntaxError> {
        if depth > MAX_DEPTH {
            return Err(self.err("nested too deeply"));
        }
        self.skip_ws();
        if self.eat(QUOTE) {
            return self.until(QUOTE).map(Value::String);
        }
        if self.eat("\"") {
            return self.json_string().map(Value::String);
        }
        if self.eat("{") {
            return self.object(depth);
        }
        if self.eat("[") {
            return self.array(depth);
        }
        let r = self.rest();
        let end = r
            .find(|c: char| matches!(c, ',' | '}' | ']') || c.is_whitespace())
            .unwrap_or(r.len());
        let word = &r[..end];
        let v = match word {
            "true" | "True" => Value::Bool(true),
            "false" | "False" => Value::Bool(false),
            "null" | "None" | "none" => Value::Null,
            _ => match serde_json::from_str::<Number>(word) {
                Ok(n) => Value::Number(n),
                Err(_) => return Err(self.err("expected a value")),
            },
        };
        self.at += end;
        Ok(v)
    }

    /// Text up to `close` (consumed).
    fn until(&mut self, close: &str) -> Result<String, SyntaxError> {
        match self.rest().find(close) {
            Some(i) => {
                let s = self.rest()[..i].to_string();
                self.at += i + close.len();
                Ok(s)
            }
            None => Err(self.err("unterminated string")),
        }
    }

    /// A JSON string body after its opening quote.
    fn json_string(&mut self) -> Result<String, SyntaxError> {
        let r = self.rest();
        let mut escaped = false;
        for (i, c) in r.char_indices() {
            match c {
                '\\' if !escaped => escaped = true,
                '"' if !escaped => {
                    let lit = &self.s[self.at - 1..self.at + i + 1];
                    let v = serde_json::from_str::<String>(lit)
                        .map_err(|_| self.err("bad escape in a string"))?;
                    self.at += i + 1;
                    return Ok(v);
                }
                _ => escaped = false,
            }
        }
        Err(self.err("unterminated string"))
    }

    fn key(&mut self) -> Result<String, SyntaxError> {
        self.skip_ws();
        if self.eat(QUOTE) {
            return self.until(QUOTE);
        }
        if self.eat("\"") {
            return self.json_string();
        }
        let r = self.rest();
        let end = r.find(':').ok_or(self.err("expected `key:`"))?;
        let key = r[..end].trim().to_string();
        if key.is_empty() || key.contains(|c: char| "{}[],".contains(c)) {
            return Err(self.err("expected a key"));
        }
        self.at += end;
        Ok(key)
    }

    fn object(&mut self, depth: usize) -> Result<Value, SyntaxError> {
        let mut m = Map::new();
        self.skip_ws();
        if self.eat("}") {
            return Ok(Value::Object(m));
        }
        loop {
            let k = self.key()?;
            self.skip_ws();
            if !self.eat(":") {
                return Err(self.err("expected `:` after a key"));
            }
            let v = self.value(depth + 1)?;
            m.insert(k, v);
            self.skip_ws();
            if self.eat("}") {
                return Ok(Value::Object(m));
            }
            if !self.eat(",") {
                return Err(self.err("expected `,` or `}` in an object"));
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Value, SyntaxError> {
        let mut a = Vec::new();
        self.skip_ws();
        if self.eat("]") {
            return Ok(Value::Array(a));
        }
        loop {
            a.push(self.value(depth + 1)?);
            self.skip_ws();
            if self.eat("]") {
                return Ok(Value::Array(a));
            }
            if !self.eat(",") {
                return Err(self.err("expected `,` or `]` in an array"));
            }
        }
    }
}

#[cfg(test)]
#[path = "gemma4_tests.rs"]
mod tests;
