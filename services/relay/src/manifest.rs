//! Tool manifests: what a provider registers, validated once and compiled for argument checks.
//!
//! A provider sends its tools grouped (`[{id, description, functions:[{name, description,
//! parameters}]}]`) or flat (`[{name, description, inputSchema, toolId?}]`), optionally wrapped
//! in `{version, tools}`. [`Manifest::parse`] checks names, sizes and that every schema is a
//! valid JSON Schema describing an object, and compiles each schema so that every call's
//! arguments are checked before the call is queued.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use toolrelay::wire::{FlatManifest, FunctionSpec, GroupedManifest, ToolGroup};

use crate::error::RelayError;

/// Version reported for a manifest whose provider gave none.
const DEFAULT_VERSION: &str = "1.0.0";
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
/// Most schema violations listed in one error message.
const MAX_REPORTED_PROBLEMS: usize = 5;
/// Longest description of one violation, in characters.
const MAX_PROBLEM_CHARS: usize = 200;

/// Limits a manifest must respect.
#[derive(Debug, Clone, Copy)]
pub struct ManifestLimits {
    /// Largest manifest in bytes of JSON.
    pub max_bytes: usize,
    /// Most functions.
    pub max_functions: usize,
}

/// A validated manifest with compiled argument schemas.
#[derive(Debug, Clone)]
pub struct Manifest {
    version: String,
    groups: Vec<Group>,
    functions: Vec<Function>,
}

/// A named group of functions (a "tool" of the grouped form).
#[derive(Debug, Clone, PartialEq)]
struct Group {
    id: String,
    description: String,
}

/// One callable function.
#[derive(Clone)]
pub struct Function {
    /// The group it belongs to, if any.
    pub tool_id: Option<String>,
    /// Its name, unique in the manifest.
    pub name: String,
    /// What it does, for the LLM.
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    pub schema: Value,
    validator: Arc<jsonschema::Validator>,
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("tool_id", &self.tool_id)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Default for Manifest {
    fn default() -> Self {
        Self {
            version: DEFAULT_VERSION.to_owned(),
            groups: Vec::new(),
            functions: Vec::new(),
        }
    }
}

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
                    let function = parse_function(function, Some(id.clone()), &at)?;
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

    /// The manifest's version string.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The functions, in registration order.
    pub fn functions(&self) -> &[Function] {
        &self.functions
    }

    /// The function called `name`, when `tool_id` (if given) is its group.
    pub fn function(&self, tool_id: Option<&str>, name: &str) -> Option<&Function> {
        self.functions
            .iter()
            .find(|f| f.name == name && tool_id.is_none_or(|id| f.group_id() == id))
    }

    /// The grouped form. A function registered without a group is a group of its own, named
    /// after it, and callers may name that group as its tool id.
    pub fn grouped(&self) -> GroupedManifest {
        let mut tools: Vec<ToolGroup> = self
            .groups
            .iter()
            .map(|group| ToolGroup {
                id: group.id.clone(),
                description: group.description.clone(),
                functions: Vec::new(),
            })
            .collect();
        for function in &self.functions {
            let spec = FunctionSpec {
                name: function.name.clone(),
                description: function.description.clone(),
                parameters: function.schema.clone(),
            };
            match tools
                .iter_mut()
                .find(|group| group.id == function.group_id())
            {
                Some(group) => group.functions.push(spec),
                None => tools.push(ToolGroup {
                    id: function.group_id().to_owned(),
                    description: function.description.clone(),
                    functions: vec![spec],
                }),
            }
        }
        GroupedManifest {
            version: self.version.clone(),
            tools,
        }
    }

    /// The flat form: one entry per function, each with its group as `toolId`.
    pub fn flat(&self) -> FlatManifest {
        self.grouped().flat()
    }
}

impl Function {
    /// The group the function belongs to: its tool id, or its own name when it has none.
    pub fn group_id(&self) -> &str {
        self.tool_id.as_deref().unwrap_or(&self.name)
    }

    /// Checks arguments against the function's schema; the error lists what is wrong, where.
    pub fn check_arguments(&self, args: &Value) -> Result<(), RelayError> {
        match describe_violations(&self.validator, args) {
            None => Ok(()),
            Some(problems) => Err(RelayError::InvalidArguments {
                function: self.name.clone(),
                problems,
            }),
        }
    }
}

/// The first few ways `instance` breaks a schema, each with where it is, or `None` when it
/// does not.
pub fn describe_violations(validator: &jsonschema::Validator, instance: &Value) -> Option<String> {
    let problems: Vec<String> = validator
        .iter_errors(instance)
        .take(MAX_REPORTED_PROBLEMS)
        .map(|error| {
            let path = error.instance_path().to_string();
            let at = if path.is_empty() {
                "(arguments)".to_owned()
            } else {
                path
            };
            // The validator quotes the offending value, which may be huge.
            format!(
                "at {at}: {}",
                shortened(&error.to_string(), MAX_PROBLEM_CHARS)
            )
        })
        .collect();
    (!problems.is_empty()).then(|| problems.join("; "))
}

fn parse_function(
    value: &Value,
    tool_id: Option<String>,
    at: &str,
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
    let validator = jsonschema::validator_for(&schema).map_err(|error| {
        invalid(format!(
            "the schema of {name} is not a valid JSON Schema: {error}"
        ))
    })?;
    Ok(Function {
        tool_id,
        description: description(object, at)?,
        name,
        schema,
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

/// `text` cut to at most `limit` characters, with an ellipsis when cut.
fn shortened(text: &str, limit: usize) -> String {
    match text.char_indices().nth(limit) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn invalid(reason: impl Into<String>) -> RelayError {
    RelayError::InvalidManifest {
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ManifestLimits = ManifestLimits {
        max_bytes: 64 * 1024,
        max_functions: 8,
    };

    fn grouped() -> Value {
        json!({"version": "2.1", "tools": [{
            "id": "people",
            "description": "People data",
            "functions": [{
                "name": "addPerson",
                "description": "Adds a person",
                "parameters": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
                    "required": ["name"]
                }
            }]
        }]})
    }

    #[test]
    fn grouped_and_flat_forms_describe_the_same_functions() {
        let manifest = Manifest::parse(&grouped(), LIMITS).unwrap();
        assert_eq!(manifest.version(), "2.1");
        let flat = manifest.flat();
        assert_eq!(flat.tools.len(), 1);
        assert_eq!(flat.tools[0].name, "addPerson");
        assert_eq!(flat.tools[0].tool_id.as_deref(), Some("people"));

        let again = Manifest::parse(&serde_json::to_value(&flat).unwrap(), LIMITS).unwrap();
        assert_eq!(again.flat(), flat);
    }

    #[test]
    fn functions_without_a_group_are_their_own_group() {
        let manifest = Manifest::parse(
            &json!([{"name": "ping", "description": "Answers pong"}]),
            LIMITS,
        )
        .unwrap();
        let grouped = manifest.grouped();
        assert_eq!(grouped.tools[0].id, "ping");
        assert!(
            manifest.function(Some("ping"), "ping").is_some(),
            "its group is its name"
        );
        assert_eq!(
            grouped.tools[0].functions[0].parameters,
            json!({"type": "object", "properties": {}})
        );
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let manifest = Manifest::parse(&grouped(), LIMITS).unwrap();
        let function = manifest.function(Some("people"), "addPerson").unwrap();
        function
            .check_arguments(&json!({"name": "Ada", "age": 36}))
            .unwrap();
        let error = function
            .check_arguments(&json!({"age": "old"}))
            .unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("/age") && message.contains("integer"),
            "{message}"
        );
        assert!(message.contains("name"), "{message}");
        assert!(manifest.function(Some("other"), "addPerson").is_none());
        assert!(manifest.function(None, "addPerson").is_some());
    }

    #[test]
    fn argument_problems_do_not_echo_huge_values() {
        let manifest = Manifest::parse(&grouped(), LIMITS).unwrap();
        let function = manifest.function(None, "addPerson").unwrap();
        let huge = json!({"name": "Ada", "age": "x".repeat(5000)});
        let error = function.check_arguments(&huge).unwrap_err();
        assert!(error.to_string().len() < 600, "{}", error.to_string().len());
    }

    #[test]
    fn bad_manifests_are_refused_with_the_reason() {
        let cases = [
            (json!("nope"), "array"),
            (json!([{"name": "has space"}]), "not a valid name"),
            (json!([{"name": "a"}, {"name": "a"}]), "appears twice"),
            (
                json!([{"name": "a", "inputSchema": {"type": "array"}}]),
                "\"type\": \"object\"",
            ),
            (
                json!([{"name": "a", "inputSchema": {"type": "object", "properties": {"x": {"type": "nonsense"}}}}]),
                "not a valid JSON Schema",
            ),
            (
                json!([{"name": "a", "inputSchema": {"$ref": "https://example.com/schema.json"}}]),
                "not a valid JSON Schema",
            ),
            (
                json!([{"name": "a", "inputSchema": {"$schema": "https://example.com/meta"}}]),
                "$schema",
            ),
            (
                json!([{"id": "g", "functions": "x"}]),
                "functions must be an array",
            ),
            (
                json!([{"name": "a", "description": 5}]),
                "description must be a string",
            ),
        ];
        for (input, expected) in cases {
            let error = Manifest::parse(&input, LIMITS).unwrap_err();
            assert_eq!(error.name(), "invalid_manifest", "{input}");
            assert!(error.to_string().contains(expected), "{input}: {error}");
        }
    }

    #[test]
    fn size_and_count_limits_apply() {
        let big = json!([{"name": "a", "description": "x".repeat(70 * 1024)}]);
        assert_eq!(
            Manifest::parse(&big, LIMITS).unwrap_err().name(),
            "manifest_too_large"
        );
        let many: Vec<Value> = (0..9).map(|i| json!({"name": format!("f{i}")})).collect();
        let error = Manifest::parse(&Value::Array(many), LIMITS).unwrap_err();
        assert!(
            error.to_string().contains("more than 8 functions"),
            "{error}"
        );
    }
}
