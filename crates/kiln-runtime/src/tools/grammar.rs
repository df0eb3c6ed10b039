//! Grammars (llguidance Lark) for tool calls and for Gemma 4's thought
//! prefix.
//!
//! Gemma 4 writes arguments in its own syntax, so each function's JSON
//! schema is compiled here into Lark rules for Gemma 4 values: objects with
//! the declared keys in the template's order (sorted), required ones
//! mandatory, no others; arrays with `minItems` / `maxItems`; strings
//! between `<|"|>` (`enum`, `const`, `minLength` / `maxLength`, `pattern`,
//! common `format`s); `anyOf` / `oneOf`, type lists and local `$ref`s.
//! Numbers, integers and booleans are the same text as in JSON, so they
//! are delegated to llguidance's JSON compiler (`%json`), bounds included.
//! The Gemma 2 / 3 convention's calls are JSON, compiled by llguidance
//! directly.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::gemma4::QUOTE;
use super::{ToolChoice, ToolDef, ToolSyntax};
use crate::constrain::ConstraintSpec;
use crate::error::{Result, RuntimeError};

/// A Lark string literal (JSON string syntax).
fn lit(s: &str) -> String {
    Value::String(s.to_string()).to_string()
}

/// Escapes `s` for a `/regex/`.
fn rx_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$/-".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Text not containing `marker`, as a Lark terminal expression.
fn text_without(marker: &str) -> String {
    format!("/(?s:.*)/ & ~/(?s:.*){}(?s:.*)/", rx_escape(marker))
}

fn invalid(tool: &str, reason: impl Into<String>) -> RuntimeError {
    RuntimeError::InvalidConstraint {
        kind: "tools",
        reason: format!("function {tool:?}: {}", reason.into()),
    }
}

/// Regexes for string `format`s (others are annotations: any string).
fn format_regex(format: &str) -> Option<&'static str> {
    Some(match format {
        "date" => r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])",
        "time" => {
            r"([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})?"
        }
        "date-time" => {
            r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\.[0-9]{1,6})?(Z|[+-][0-9]{2}:[0-9]{2})"
        }
        "uuid" => r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        "ipv4" => r"((25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])\.){3}(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])",
        "email" => r"[A-Za-z0-9._%+-]{1,32}@[A-Za-z0-9-]{1,32}(\.[A-Za-z0-9-]{1,16}){1,3}",
        _ => return None,
    })
}

/// Compiles JSON schemas into Lark rules for Gemma 4 values.
struct Gemma4Rules<'a> {
    tool: &'a str,
    root: &'a Value,
    rules: Vec<String>,
    /// `$ref` target → its rule name (also breaks recursion).
    refs: BTreeMap<String, String>,
    next: usize,
}

impl<'a> Gemma4Rules<'a> {
    fn new(tool: &'a str, root: &'a Value, prefix: usize) -> Self {
        Gemma4Rules {
            tool,
            root,
            rules: Vec::new(),
            refs: BTreeMap::new(),
            next: prefix * 10_000,
        }
    }

    fn rule(&mut self, body: String) -> String {
        let name = format!("g{}", self.next);
        self.next += 1;
        self.rules.push(format!("{name}: {body}"));
        name
    }

    /// A rule matching values of `schema`.
    fn value(&mut self, schema: &Value, depth: usize) -> Result<String> {
        if depth > 32 {
            return Err(invalid(self.tool, "the schema nests too deeply"));
        }
        let obj = match schema {
            Value::Bool(true) => return Ok("gany".into()),
            Value::Bool(false) => {
                return Err(invalid(self.tool, "a `false` schema allows nothing"))
            }
            Value::Object(o) => o,
            _ => {
                return Err(invalid(
                    self.tool,
                    "a schema must be an object or a boolean",
                ))
            }
        };
        if let Some(r) = obj.get("$ref") {
            return self.reference(r, depth);
        }
        if let Some(v) = obj.get("const") {
            return Ok(self.rule(self.literal(v)));
        }
        if let Some(e) = obj.get("enum") {
            let items = e
                .as_array()
                .filter(|a| !a.is_empty())
                .ok_or_else(|| invalid(self.tool, "`enum` must be a non-empty array"))?;
            let alts: Vec<String> = items.iter().map(|v| self.literal(v)).collect();
            return Ok(self.rule(alts.join(" | ")));
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(list) = obj.get(key) {
                let items = list.as_array().filter(|a| !a.is_empty()).ok_or_else(|| {
                    invalid(self.tool, format!("`{key}` must be a non-empty array"))
                })?;
                let alts = items
                    .iter()
                    .map(|s| self.value(s, depth + 1))
                    .collect::<Result<Vec<_>>>()?;
                return Ok(self.rule(alts.join(" | ")));
            }
        }
        if let Some(all) = obj.get("allOf") {
            match all.as_array().map(Vec::as_slice) {
                Some([one]) => return self.value(one, depth + 1),
                _ => {
                    return Err(invalid(
                        self.tool,
                        "`allOf` with several schemas is not supported",
                    ))
                }
            }
        }
        match obj.get("type") {
            None => Ok(if obj.contains_key("properties") {
                self.object(obj, depth)?
            } else {
                "gany".into()
            }),
            Some(Value::String(t)) => self.typed(t, obj, depth),
            Some(Value::Array(ts)) => {
                let mut alts = Vec::new();
                for t in ts {
                    let t = t
                        .as_str()
                        .ok_or_else(|| invalid(self.tool, "`type` lists hold strings"))?;
                    alts.push(self.typed(t, obj, depth)?);
                }
                Ok(self.rule(alts.join(" | ")))
            }
            Some(_) => Err(invalid(self.tool, "`type` must be a string or a list")),
        }
    }

    fn typed(&mut self, t: &str, obj: &Map<String, Value>, depth: usize) -> Result<String> {
        let bounds = [
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
        ];
        Ok(match t {
            "object" => self.object(obj, depth)?,
            "array" => self.array(obj, depth)?,
            "string" => self.string(obj)?,
            "boolean" => "gbool".into(),
            "null" => "gnull".into(),
            "integer" | "number" if !bounds.iter().any(|b| obj.contains_key(*b)) => {
                if t == "integer" {
                    "GINT".into()
                } else {
                    "GNUM".into()
                }
            }
            "integer" | "number" => {
                // Same text as JSON: llguidance enforces the bounds.
                let mut s = Map::new();
                s.insert("type".into(), json!(t));
                for b in bounds {
                    if let Some(v) = obj.get(b) {
                        s.insert(b.into(), v.clone());
                    }
                }
                self.rule(format!("%json {}", Value::Object(s)))
            }
            other => return Err(invalid(self.tool, format!("unknown type {other:?}"))),
        })
    }

    fn reference(&mut self, r: &Value, depth: usize) -> Result<String> {
        let path = r.as_str().unwrap_or_default();
        if let Some(name) = self.refs.get(path) {
            return Ok(name.clone());
        }
        let target = path
            .strip_prefix('#')
            .and_then(|p| self.root.pointer(p))
            .ok_or_else(|| {
                invalid(
                    self.tool,
                    format!("unresolvable $ref {path:?} (only local refs are supported)"),
                )
            })?;
        // Reserve the name first so that recursive refs find it.
        let name = format!("g{}", self.next);
        self.next += 1;
        self.refs.insert(path.to_string(), name.clone());
        let body = self.value(target, depth + 1)?;
        self.rules.push(format!("{name}: {body}"));
        Ok(name)
    }

    /// The Gemma 4 text of a constant.
    fn literal(&self, v: &Value) -> String {
        let mut s = String::new();
        super::gemma4::format_value(v, false, &mut s);
        lit(&s)
    }

    fn string(&mut self, obj: &Map<String, Value>) -> Result<String> {
        let n = |k: &str| obj.get(k).and_then(Value::as_u64);
        let body = if let Some(p) = obj.get("pattern").and_then(Value::as_str) {
            let p = p.strip_prefix('^').unwrap_or(p);
            let p = p.strip_suffix('$').unwrap_or(p);
            format!("/{}/", p.replace('/', "\\/"))
        } else if let Some(rx) = obj
            .get("format")
            .and_then(Value::as_str)
            .and_then(format_regex)
        {
            format!("/{rx}/")
        } else {
            let (lo, hi) = (n("minLength").unwrap_or(0), n("maxLength"));
            let len = match hi {
                Some(hi) if hi < lo => {
                    return Err(invalid(self.tool, "maxLength is below minLength"))
                }
                Some(hi) => format!("{{{lo},{hi}}}"),
                None => format!("{{{lo},}}"),
            };
            format!("(/(?s:.{len})/ & ~/(?s:.*){}(?s:.*)/)", rx_escape(QUOTE))
        };
        let name = format!("GSTR{}", self.next);
        self.next += 1;
        let q = lit(QUOTE);
        self.rules.push(format!("{name}: {q} {body} {q}"));
        Ok(name)
    }

    fn array(&mut self, obj: &Map<String, Value>, depth: usize) -> Result<String> {
        let item = match obj.get("items") {
            Some(s) => self.value(s, depth + 1)?,
            None => "gany".into(),
        };
        let lo = obj.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let hi = obj.get("maxItems").and_then(Value::as_u64);
        if hi.is_some_and(|hi| hi < lo) {
            return Err(invalid(self.tool, "maxItems is below minItems"));
        }
        let rest_lo = lo.saturating_sub(1);
        let rest = match hi {
            Some(0) => return Ok(self.rule("\"[]\"".into())),
            Some(hi) => format!("(\",\" {item}){{{rest_lo},{}}}", hi - 1),
            None => format!("(\",\" {item}){{{rest_lo},}}"),
        };
        let body = if lo == 0 {
            format!("\"[\" ({item} {rest})? \"]\"")
        } else {
            format!("\"[\" {item} {rest} \"]\"")
        };
        Ok(self.rule(body))
    }

    /// Declared properties in the template's (case-insensitive sorted)
    /// order; optional ones may be left out, commas in between.
    fn object(&mut self, obj: &Map<String, Value>, depth: usize) -> Result<String> {
        let Some(props) = obj.get("properties").and_then(Value::as_object) else {
            return Ok("gany_obj".into());
        };
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if let Some(r) = required.iter().find(|r| !props.contains_key(**r)) {
            return Err(invalid(
                self.tool,
                format!("required property {r:?} is not declared"),
            ));
        }
        let mut keys: Vec<&String> = props.keys().collect();
        keys.sort_by_key(|k| k.to_lowercase());
        let mut members = Vec::new();
        for k in &keys {
            let v = self.value(&props[k.as_str()], depth + 1)?;
            members.push((lit(&format!("{k}:")), v, required.contains(&k.as_str())));
        }
        // first[i]: members i.. when none was written yet; more[i]: after one.
        let (mut first, mut more) = ("\"\"".to_string(), "\"\"".to_string());
        for (key, v, req) in members.into_iter().rev() {
            let f = if req {
                format!("{key} {v} {more}")
            } else {
                format!("{key} {v} {more} | {first}")
            };
            let m = if req {
                format!("\",\" {key} {v} {more}")
            } else {
                format!("\",\" {key} {v} {more} | {more}")
            };
            first = self.rule(f);
            more = self.rule(m);
        }
        Ok(self.rule(format!("\"{{\" {first} \"}}\"")))
    }
}

/// Rules every Gemma 4 value grammar shares: any value, numbers, strings.
fn gemma4_common() -> String {
    let q = lit(QUOTE);
    format!(
        "gany: GSTR | GNUM | gbool | gnull | gany_obj | gany_arr\n\
         gany_obj: \"{{\" (GKEY \":\" gany (\",\" GKEY \":\" gany)*)? \"}}\"\n\
         gany_arr: \"[\" (gany (\",\" gany)*)? \"]\"\n\
         gbool: \"true\" | \"false\"\n\
         gnull: \"None\"\n\
         GKEY: /[A-Za-z_][A-Za-z0-9_]*/\n\
         GINT: /-?(0|[1-9][0-9]*)/\n\
         GNUM: /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][+-]?[0-9]+)?/\n\
         GSTR: {q} GSTR_BODY {q}\n\
         GSTR_BODY: {}\n",
        text_without(QUOTE)
    )
}

/// Gemma 4's optional thought block: any thought with thinking on, else
/// only the empty block larger models write anyway (GEMMA.md §2.3).
pub fn gemma4_thought_rule(thinking: bool) -> String {
    if thinking {
        "thought[lazy]: \"<|channel>\" /(?s:.*)/ \"<channel|>\"\n".into()
    } else {
        "thought: \"<|channel>thought\\n<channel|>\"\n".into()
    }
}

/// A Gemma 4 constraint with the optional thought block in front (the
/// server's `response_format` on a Gemma 4 model); Lark grammars are
/// used as given.
pub fn with_gemma4_thought(spec: ConstraintSpec, thinking: bool) -> ConstraintSpec {
    let body = match &spec {
        ConstraintSpec::JsonSchema(s) => format!("%json {s}"),
        ConstraintSpec::JsonObject => "%json {\"type\": \"object\"}".into(),
        ConstraintSpec::Regex(rx) => format!("/{}/", llguidance::regex_to_lark(rx, "")),
        ConstraintSpec::Choice(items) => {
            items.iter().map(|s| lit(s)).collect::<Vec<_>>().join(" | ")
        }
        ConstraintSpec::Lark(_) => return spec,
    };
    let body = match &spec {
        // Keep the compact layout of ConstraintSpec::JsonSchema.
        ConstraintSpec::JsonSchema(Value::Object(o)) if !o.contains_key("x-guidance") => {
            let mut o = o.clone();
            o.insert(
                "x-guidance".into(),
                crate::constrain::compact_json_options(),
            );
            format!("%json {}", Value::Object(o))
        }
        ConstraintSpec::JsonObject => format!(
            "%json {}",
            json!({"type": "object", "x-guidance": crate::constrain::compact_json_options()})
        ),
        _ => body,
    };
    ConstraintSpec::Lark(format!(
        "start: thought? body\nbody: {body}\n{}",
        gemma4_thought_rule(thinking)
    ))
}

/// The constraint for a reply that may (auto), must (required, named) or
/// must not (none: no constraint) call the declared functions.
pub fn tool_calls(
    syntax: ToolSyntax,
    tools: &[ToolDef],
    choice: &ToolChoice,
    thinking: bool,
) -> Result<Option<ConstraintSpec>> {
    let chosen: Vec<&ToolDef> = match choice {
        ToolChoice::None => return Ok(None),
        ToolChoice::Named(n) => tools.iter().filter(|t| &t.name == n).collect(),
        _ => tools.iter().collect(),
    };
    if chosen.is_empty() {
        return Ok(None);
    }
    let (open, close) = syntax.markers();
    let mut g = String::new();
    let mut bodies = Vec::new();
    for (i, t) in chosen.iter().enumerate() {
        let name = format!("fn{i}");
        match syntax {
            ToolSyntax::Gemma4 => {
                let mut rules = Gemma4Rules::new(&t.name, &t.parameters, i + 1);
                let args = rules.object(t.parameters.as_object().unwrap_or(&Map::new()), 0)?;
                g.push_str(&format!(
                    "{name}: {} {args}\n",
                    lit(&format!("call:{}", t.name))
                ));
                for r in rules.rules {
                    g.push_str(&r);
                    g.push('\n');
                }
            }
            ToolSyntax::JsonBlock => {
                let mut schema = json!({
                    "type": "object",
                    "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": false,
                    "x-guidance": crate::constrain::compact_json_options(),
                });
                // Local `$ref`s point at the parameters' root: move their
                // definitions to the wrapper's root.
                for defs in ["$defs", "definitions"] {
                    if let Some(d) = t.parameters.get(defs) {
                        schema[defs] = d.clone();
                    }
                }
                g.push_str(&format!("{name}: %json {schema}\n"));
            }
        }
        bodies.push(name);
    }
    let sep = match syntax {
        ToolSyntax::Gemma4 => "",
        ToolSyntax::JsonBlock => "\"\\n\"",
    };
    let (o, c) = (lit(open), lit(close));
    g.push_str(&format!("call: ({}) {c}\n", bodies.join(" | ")));
    g.push_str(&format!("more: ({sep} {o} call)*\n"));
    let reply = match choice {
        ToolChoice::Named(_) => format!("{o} call"),
        ToolChoice::Required => format!("{o} call more"),
        _ => {
            g.push_str(&format!("head[lazy]: /(?s:.*)/ {o}\n"));
            g.push_str(&format!("TEXT: {}\n", text_without(open)));
            "TEXT | head call more".into()
        }
    };
    let start = match syntax {
        ToolSyntax::Gemma4 => {
            g.push_str(&gemma4_common());
            g.push_str(&gemma4_thought_rule(thinking));
            format!("start: thought? {reply}\n")
        }
        ToolSyntax::JsonBlock => format!("start: {reply}\n"),
    };
    Ok(Some(ConstraintSpec::Lark(start + &g)))
}

#[cfg(test)]
#[path = "grammar_tests.rs"]
mod tests;
