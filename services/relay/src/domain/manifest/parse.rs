//! Parsing: a manifest as a provider registers it (grouped or flat, optionally wrapped in
//! `{version, tools}`) checked and compiled into a [`Manifest`], and the form a store keeps it
//! in read back the same way.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use toolrelay::wire::ToolHints;

use super::cost::{MAX_SCHEMA_NODES, schema_size};
use super::{DEFAULT_VERSION, Function, Group, Manifest, ManifestLimits};
use crate::error::RelayError;

/// Longest title of a function, in characters.
const MAX_TITLE_CHARS: usize = 100;
/// Longest description of a function or tool, in bytes.
const MAX_DESCRIPTION_BYTES: usize = 8 * 1024;
/// The drafts whose meta-schemas the relay knows; other `$schema` URIs are refused.
const KNOWN_DRAFTS: [&str; 5] = [
    "http://json-schema.org/draft-04/schema",
    "http://json-schema.org/draft-06/schema",
    "http://json-schema.org/draft-07/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "https://json-schema.org/draft/2020-12/schema",
];
/// Steps a backtracking `pattern` may take per match (fancy-regex's default is a million).
const REGEX_BACKTRACK_LIMIT: usize = 10_000;

impl Manifest {
    /// Validates what a provider registered. On error nothing changes for the session: the
    /// caller keeps the previous manifest.
    pub fn parse(input: &Value, limits: ManifestLimits) -> Result<Self, RelayError> {
        let size = serde_json::to_vec(input).map_or(usize::MAX, |bytes| bytes.len());
        if size > limits.max_bytes {
            return Err(RelayError::ManifestTooLarge {
                size,
                limit: limits.max_bytes,
            });
        }
        let (version, entries) = match input {
            Value::Array(entries) => (DEFAULT_VERSION.to_owned(), entries),
            Value::Object(object) => {
                let version = match object.get("version") {
                    None | Some(Value::Null) => DEFAULT_VERSION.to_owned(),
                    Some(Value::String(v)) if !v.is_empty() && v.len() <= 64 => v.clone(),
                    Some(_) => {
                        return Err(invalid("version must be a string of 1 to 64 characters"));
                    }
                };
                match object.get("tools") {
                    Some(Value::Array(entries)) => (version, entries),
                    _ => return Err(invalid("expected {\"tools\": [...]}, with tools an array")),
                }
            }
            _ => return Err(invalid("tools must be an array of tools or functions")),
        };

        let mut manifest = Self {
            version,
            ..Self::default()
        };
        let mut names = HashSet::new();
        let mut group_ids = HashSet::new();
        for (index, entry) in entries.iter().enumerate() {
            let Value::Object(entry) = entry else {
                return Err(invalid(format!("tools[{index}] must be an object")));
            };
            if let Some(functions) = entry.get("functions") {
                let id = checked_name(entry.get("id"), &format!("tools[{index}].id"))?;
                if !group_ids.insert(id.clone()) {
                    return Err(invalid(format!("tool id {id} appears twice")));
                }
                let Value::Array(functions) = functions else {
                    return Err(invalid(format!(
                        "tools[{index}].functions must be an array"
                    )));
                };
                for (position, function) in functions.iter().enumerate() {
                    let at = format!("tools[{index}].functions[{position}]");
                    let function = parse_function(function, Some(id.clone()), &at, limits)?;
                    manifest.push(function, &mut names)?;
                }
                manifest.groups.push(Group {
                    description: description(entry, &format!("tools[{index}]"))?,
                    id,
                });
            } else {
                let tool_id = match entry.get("toolId") {
                    None | Some(Value::Null) => None,
                    value => Some(checked_name(value, &format!("tools[{index}].toolId"))?),
                };
                let function = parse_function(
                    &Value::Object(entry.clone()),
                    tool_id,
                    &format!("tools[{index}]"),
                    limits,
                )?;
                manifest.push(function, &mut names)?;
            }
            if manifest.functions.len() > limits.max_functions {
                return Err(invalid(format!(
                    "more than {} functions; register fewer",
                    limits.max_functions
                )));
            }
        }
        Ok(manifest)
    }

    fn push(&mut self, function: Function, names: &mut HashSet<String>) -> Result<(), RelayError> {
        if !names.insert(function.name.clone()) {
            return Err(invalid(format!(
                "function name {} appears twice; names must be unique in a session",
                function.name
            )));
        }
        self.functions.push(function);
        Ok(())
    }
    /// The manifest as a store keeps it: its grouped form, which [`Manifest::from_json`]
    /// reads back into the same manifest.
    pub fn to_json(&self) -> String {
        serde_json::to_string(&self.grouped()).unwrap_or_else(|_| "[]".to_owned())
    }

    /// A manifest a store kept ([`Manifest::to_json`]), validated and compiled again.
    pub fn from_json(json: &str, limits: ManifestLimits) -> Result<Self, RelayError> {
        let value: Value = serde_json::from_str(json)
            .map_err(|error| invalid(format!("the stored manifest is not JSON ({error})")))?;
        // Stored manifests were checked when registered; the size limit may have changed since.
        Self::parse(
            &value,
            ManifestLimits {
                max_bytes: usize::MAX,
                ..limits
            },
        )
    }
}

fn parse_function(
    value: &Value,
    tool_id: Option<String>,
    at: &str,
    limits: ManifestLimits,
) -> Result<Function, RelayError> {
    let Value::Object(object) = value else {
        return Err(invalid(format!("{at} must be an object")));
    };
    let name = checked_name(object.get("name"), &format!("{at}.name"))?;
    let schema = match object
        .get("inputSchema")
        .or_else(|| object.get("parameters"))
    {
        None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
        Some(Value::Object(schema)) => object_schema(schema, &name)?,
        Some(_) => {
            return Err(invalid(format!(
                "the schema of {name} must be a JSON Schema object such as {{\"type\": \"object\", \"properties\": {{…}}}}"
            )));
        }
    };
    if toolrelay::json::depth(&schema) > limits.max_depth {
        return Err(invalid(format!(
            "the schema of {name} is nested more than {} levels deep (the limit)",
            limits.max_depth
        )));
    }
    let size = schema_size(&schema, MAX_SCHEMA_NODES)
        .map_err(|reason| invalid(format!("the schema of {name} is refused: {reason}")))?;
    let validator = jsonschema::options()
        .with_pattern_options(
            jsonschema::PatternOptions::fancy_regex().backtrack_limit(REGEX_BACKTRACK_LIMIT),
        )
        .build(&schema)
        .map_err(|error| {
            invalid(format!(
                "the schema of {name} is not a valid JSON Schema: {error}"
            ))
        })?;
    Ok(Function {
        tool_id,
        hints: hints(object, &name, at)?,
        description: description(object, at)?,
        name,
        schema,
        schema_size: size.subschemas,
        recursive: size.recursive,
        validator: Arc::new(validator),
    })
}

/// Checks that a schema describes an object; a schema without `type` gets `"type": "object"`.
fn object_schema(schema: &Map<String, Value>, name: &str) -> Result<Value, RelayError> {
    let mut schema = schema.clone();
    match schema.get("type") {
        None => {
            schema.insert("type".into(), Value::String("object".into()));
        }
        Some(Value::String(kind)) if kind == "object" => {}
        Some(_) => {
            return Err(invalid(format!(
                "the schema of {name} must have \"type\": \"object\" (arguments are always a JSON object)"
            )));
        }
    }
    if let Some(uri) = schema.get("$schema") {
        let known = uri
            .as_str()
            .map(|uri| uri.trim_end_matches('#'))
            .is_some_and(|uri| KNOWN_DRAFTS.contains(&uri));
        if !known {
            return Err(invalid(format!(
                "the schema of {name} names an unknown $schema; use a standard draft (for example https://json-schema.org/draft/2020-12/schema) or leave $schema out"
            )));
        }
    }
    Ok(Value::Object(schema))
}

fn checked_name(value: Option<&Value>, at: &str) -> Result<String, RelayError> {
    match value {
        Some(Value::String(name)) if is_valid_name(name) => Ok(name.clone()),
        Some(Value::String(name)) => Err(invalid(format!(
            "{at} {name:?} is not a valid name: use 1 to 64 letters, digits or underscores"
        ))),
        _ => Err(invalid(format!(
            "{at} is missing (a string of letters, digits or underscores)"
        ))),
    }
}

/// Names of tools and functions: `^[A-Za-z0-9_]{1,64}$`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

fn description(object: &Map<String, Value>, at: &str) -> Result<String, RelayError> {
    match object.get("description") {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(text)) if text.len() <= MAX_DESCRIPTION_BYTES => Ok(text.clone()),
        Some(Value::String(_)) => Err(invalid(format!(
            "{at}.description is longer than {MAX_DESCRIPTION_BYTES} bytes"
        ))),
        Some(_) => Err(invalid(format!("{at}.description must be a string"))),
    }
}
/// What a function says it does to data: `title` (a string) and the booleans `readOnly`,
/// `destructive`, `idempotent` and `untrustedContent`, each optional; read-only and
/// destructive at once is refused.
fn hints(object: &Map<String, Value>, name: &str, at: &str) -> Result<ToolHints, RelayError> {
    let flag = |key: &str| match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(value)) => Ok(Some(*value)),
        Some(_) => Err(invalid(format!(
            "{at}.{key} must be true or false (or left out)"
        ))),
    };
    let title = match object.get("title") {
        None | Some(Value::Null) => None,
        Some(Value::String(title))
            if !title.trim().is_empty() && title.chars().count() <= MAX_TITLE_CHARS =>
        {
            Some(title.clone())
        }
        Some(_) => {
            return Err(invalid(format!(
                "{at}.title must be a string of 1 to {MAX_TITLE_CHARS} characters, such as \"Create graph\""
            )));
        }
    };
    let hints = ToolHints {
        title,
        read_only: flag("readOnly")?,
        destructive: flag("destructive")?,
        idempotent: flag("idempotent")?,
        untrusted_content: flag("untrustedContent")?,
    };
    if hints.read_only == Some(true) && hints.destructive == Some(true) {
        return Err(invalid(format!(
            "{name} is marked both readOnly and destructive; a function that only reads is not destructive: drop one"
        )));
    }
    Ok(hints)
}

fn invalid(reason: impl Into<String>) -> RelayError {
    RelayError::InvalidManifest {
        reason: reason.into(),
    }
}
