//! Tool manifests: what a provider registers, validated once and compiled for argument checks.
//!
//! A provider sends its tools grouped (`[{id, description, functions:[{name, description,
//! parameters}]}]`) or flat (`[{name, description, inputSchema, toolId?}]`), optionally wrapped
//! in `{version, tools}`; a function may add `title`, `readOnly`, `destructive` and
//! `idempotent` (what it does to data, SPEC §4). [`Manifest::parse`] checks names, sizes and that every schema is a
//! valid JSON Schema describing an object, and compiles each schema so that every call's
//! arguments are checked before the call is queued.
//!
//! Schemas come from anyone who creates a session, so their cost is bounded when they are
//! registered ([`schema_size`]): a schema whose `$ref`s and `anyOf`/`allOf`/`oneOf` branches,
//! followed, expand to more than [`MAX_SCHEMA_NODES`] subschemas, whose `$ref`s loop without
//! descending into the arguments, or that is nested too deeply is refused with
//! `invalid_manifest` naming the limit. A check costs at most that size times the number of
//! JSON values in the arguments; checks that may take more than a moment run off the async
//! threads, and arguments that would cost more than [`MAX_CHECK_COST`] are refused
//! ([`Function::check_arguments_async`]).
//!
//! # Layout
//!
//! This file holds the types and the forms a manifest is shown in (grouped, flat);
//! `parse` reads and validates what a provider registers (and what a store kept), `cache`
//! keeps this replica's compiled manifests, `check` checks a call's arguments, and `cost`
//! bounds what a schema may cost to check.

mod cache;
mod check;
mod cost;
mod parse;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use serde_json::Value;
use toolrelay::wire::{FlatManifest, FunctionSpec, GroupedManifest, ToolGroup, ToolHints};

pub use cache::ManifestCache;
pub use check::{MAX_CHECK_COST, describe_violations};
pub use cost::{MAX_SCHEMA_NODES, SchemaSize, applications, schema_size};
pub use parse::is_valid_name;

/// Version reported for a manifest whose provider gave none.
const DEFAULT_VERSION: &str = "1.0.0";

/// Limits a manifest must respect.
#[derive(Debug, Clone, Copy)]
pub struct ManifestLimits {
    /// Largest manifest in bytes of JSON.
    pub max_bytes: usize,
    /// Most functions.
    pub max_functions: usize,
    /// Deepest JSON nesting of a schema.
    pub max_depth: usize,
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
    /// What it does to data (title, read-only, destructive, idempotent).
    pub hints: ToolHints,
    /// Subschemas the schema expands to, with its `$ref`s followed ([`schema_size`]).
    pub schema_size: usize,
    /// Whether a `$ref` of the schema leads back to itself for a part of the value (a tree of
    /// objects): then checking may apply a subschema to a value more than `schema_size` times,
    /// and the cost of a check is counted on the arguments themselves ([`Function::check_cost`]).
    recursive: bool,
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
                hints: function.hints.clone(),
                output_schema: None,
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
}
