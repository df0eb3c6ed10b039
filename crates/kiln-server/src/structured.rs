//! Parsing the structured-output and tool fields of a chat request:
//! `response_format`, `tools`, `tool_choice`, `reasoning_effort` / `think`,
//! and the tool parts of messages (assistant `tool_calls`, `tool` results).
//! Shapes only; schemas and grammars are compiled (and rejected) when the
//! request runs.

use kiln_runtime::constrain::ConstraintSpec;
use kiln_runtime::tools::{ToolCall, ToolChoice, ToolDef};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Most tools per request.
pub const MAX_TOOLS: usize = 128;

fn obj<'a>(v: &'a Value, param: &str) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object()
        .ok_or_else(|| ApiError::param(param, format!("'{param}' must be an object")))
}

fn string<'a>(o: &'a Map<String, Value>, key: &str, param: &str) -> Result<&'a str, ApiError> {
    o.get(key).and_then(Value::as_str).ok_or_else(|| {
        ApiError::param(
            format!("{param}.{key}"),
            format!("'{param}.{key}' must be a string"),
        )
    })
}

/// `response_format`: `text` (None), `json_object`, `json_schema` (with
/// `json_schema.schema`; `strict` is accepted, output is always valid), and
/// Kiln's `regex` (`"regex": RE`) and `grammar` (`"grammar": LARK`).
pub fn response_format(v: Option<&Value>) -> Result<Option<ConstraintSpec>, ApiError> {
    const P: &str = "response_format";
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let o = obj(v, P)?;
    Ok(match string(o, "type", P)? {
        "text" => None,
        "json_object" => Some(ConstraintSpec::JsonObject),
        "json_schema" => {
            let js = o.get("json_schema").ok_or_else(|| {
                ApiError::param(
                    "response_format.json_schema",
                    "'response_format.json_schema' is required",
                )
            })?;
            let js = obj(js, "response_format.json_schema")?;
            if let Some(s) = js.get("strict").filter(|s| !s.is_null() && !s.is_boolean()) {
                return Err(ApiError::param(
                    "response_format.json_schema.strict",
                    format!("'strict' must be true or false, not {s}"),
                ));
            }
            match js.get("schema") {
                Some(s @ Value::Object(_)) => Some(ConstraintSpec::JsonSchema(s.clone())),
                Some(_) => {
                    return Err(ApiError::param(
                        "response_format.json_schema.schema",
                        "'schema' must be a JSON schema object",
                    ))
                }
                None => Some(ConstraintSpec::JsonObject),
            }
        }
        "regex" => Some(ConstraintSpec::Regex(string(o, "regex", P)?.to_string())),
        "grammar" => Some(ConstraintSpec::Lark(string(o, "grammar", P)?.to_string())),
        t => {
            return Err(ApiError::param(
                "response_format.type",
                format!(
                "response_format type {t:?}: use text, json_object, json_schema, regex or grammar"
            ),
            ))
        }
    })
}

/// `tools`: `[{"type":"function","function":{"name","description","parameters"}}]`.
pub fn tools(v: Option<&Value>) -> Result<Vec<ToolDef>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let list = v
        .as_array()
        .ok_or_else(|| ApiError::param("tools", "'tools' must be an array"))?;
    if list.len() > MAX_TOOLS {
        return Err(ApiError::param(
            "tools",
            format!("at most {MAX_TOOLS} tools are allowed"),
        ));
    }
    let mut out: Vec<ToolDef> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let p = format!("tools[{i}]");
        let o = obj(t, &p)?;
        if o.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::param(
                format!("{p}.type"),
                "only tools of type \"function\" are supported",
            ));
        }
        let f = obj(
            o.get("function").unwrap_or(&Value::Null),
            &format!("{p}.function"),
        )?;
        let name = string(f, "name", &format!("{p}.function"))?;
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        {
            return Err(ApiError::param(
                format!("{p}.function.name"),
                format!("function name {name:?} must be letters, digits, '_', '-' or '.'"),
            ));
        }
        if out.iter().any(|d| d.name == name) {
            return Err(ApiError::param(
                format!("{p}.function.name"),
                format!("function {name:?} is declared twice"),
            ));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(s @ Value::Object(_)) => s.clone(),
            Some(_) => {
                return Err(ApiError::param(
                    format!("{p}.function.parameters"),
                    "'parameters' must be a JSON schema object",
                ))
            }
        };
        out.push(ToolDef {
            name: name.to_string(),
            description: f
                .get("description")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            parameters,
        });
    }
    Ok(out)
}

/// `tool_choice`: `auto` (default with tools), `none`, `required`, or
/// `{"type":"function","function":{"name":…}}` naming a declared function.
pub fn tool_choice(v: Option<&Value>, tools: &[ToolDef]) -> Result<ToolChoice, ApiError> {
    const P: &str = "tool_choice";
    let choice = match v.filter(|v| !v.is_null()) {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            s => {
                return Err(ApiError::param(
                    P,
                    format!("tool_choice {s:?}: use auto, none, required or a function"),
                ))
            }
        },
        Some(v) => {
            let o = obj(v, P)?;
            let f = obj(
                o.get("function").unwrap_or(&Value::Null),
                "tool_choice.function",
            )?;
            ToolChoice::Named(string(f, "name", "tool_choice.function")?.to_string())
        }
    };
    match &choice {
        ToolChoice::Named(n) if !tools.iter().any(|t| &t.name == n) => Err(ApiError::param(
            "tool_choice",
            format!("tool_choice names function {n:?}, which is not in 'tools'"),
        )),
        ToolChoice::Required | ToolChoice::Named(_) if tools.is_empty() => {
            Err(ApiError::param(P, "tool_choice needs 'tools'"))
        }
        _ => Ok(choice),
    }
}

/// Thinking: `reasoning_effort` (any level but `none`), Kiln's `think`
/// switch, or `chat_template_kwargs.enable_thinking`.
pub fn thinking(f: &Map<String, Value>) -> Result<bool, ApiError> {
    if let Some(b) = f.get("think").filter(|v| !v.is_null()) {
        return b
            .as_bool()
            .ok_or_else(|| ApiError::param("think", "'think' must be true or false"));
    }
    if let Some(k) = f
        .get("chat_template_kwargs")
        .and_then(|k| k.get("enable_thinking"))
    {
        if let Some(b) = k.as_bool() {
            return Ok(b);
        }
    }
    match f.get("reasoning_effort").filter(|v| !v.is_null()) {
        None => Ok(false),
        Some(Value::String(s)) => match s.as_str() {
            "none" => Ok(false),
            "minimal" | "low" | "medium" | "high" => Ok(true),
            s => Err(ApiError::param(
                "reasoning_effort",
                format!("reasoning_effort {s:?}: use none, minimal, low, medium or high"),
            )),
        },
        Some(_) => Err(ApiError::param(
            "reasoning_effort",
            "'reasoning_effort' must be a string",
        )),
    }
}

/// An assistant message's `tool_calls` (arguments a JSON string or object).
pub fn message_tool_calls(v: Option<&Value>, param: &str) -> Result<Vec<ToolCall>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let bad = |m: &str| ApiError::param(format!("{param}.tool_calls"), m.to_string());
    let list = v
        .as_array()
        .ok_or_else(|| bad("'tool_calls' must be an array"))?;
    list.iter()
        .map(|c| {
            let f = c
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| bad("a tool call needs a 'function' object"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a tool call needs a function name"))?;
            let arguments = match f.get("arguments") {
                None | Some(Value::Null) => Value::Object(Map::new()),
                Some(Value::String(s)) => serde_json::from_str(s).map_err(|e| {
                    bad(&format!(
                        "the arguments of {name:?} are not valid JSON: {e}"
                    ))
                })?,
                Some(a) => a.clone(),
            };
            Ok(ToolCall {
                id: c
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                name: name.to_string(),
                arguments,
            })
        })
        .collect()
}
