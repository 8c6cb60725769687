//! Tool manifests: what a provider registers, validated once and compiled for argument checks.
//!
//! A provider sends its tools grouped (`[{id, description, functions:[{name, description,
//! parameters}]}]`) or flat (`[{name, description, inputSchema, toolId?}]`), optionally wrapped
//! in `{version, tools}`. [`Manifest::parse`] checks names, sizes and that every schema is a
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

use std::collections::{HashMap, HashSet};
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
/// Most subschemas a function's schema may expand to, with its `$ref`s followed.
pub const MAX_SCHEMA_NODES: usize = 5_000;
/// Check cost (schema nodes × argument values) above which a check leaves the async threads.
const INLINE_CHECK_COST: usize = 20_000;
/// Most a check may cost: about a second of one core in a debug build, a fraction of that in
/// a release build. A call over it is refused before any checking, with what to do instead.
pub const MAX_CHECK_COST: usize = 20_000_000;
/// Steps a backtracking `pattern` may take per match (fancy-regex's default is a million).
const REGEX_BACKTRACK_LIMIT: usize = 10_000;

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

/// Compiled manifests of this replica, by session and revision: a store holds only the JSON,
/// and compiling schemas for every call would cost more than the call.
///
/// Sessions that register the same tools (every tab of one plugin does) share one compiled
/// manifest: a replica keeps one copy of each distinct manifest however many sessions use it,
/// and compiles it once.
#[derive(Debug, Default)]
pub struct ManifestCache {
    /// A std mutex: held for one map operation, never across an `.await`.
    entries:
        std::sync::Mutex<std::collections::HashMap<crate::code::SessionCode, (u64, Arc<Manifest>)>>,
    /// Compiled manifests in use, by their JSON ([`Manifest::to_json`]); an entry whose
    /// manifest no session uses any more is pruned as the map grows.
    shared: std::sync::Mutex<std::collections::HashMap<String, std::sync::Weak<Manifest>>>,
}

/// Sessions whose compiled manifests a replica keeps at most.
const CACHED_MANIFESTS: usize = 10_000;
/// Distinct manifests past which the shared ones no session uses are pruned (again at every
/// doubling, so pruning costs a constant per manifest added).
const SHARED_PRUNE_AT: usize = 64;

impl ManifestCache {
    /// The compiled manifest of `code` at `revision`, if this replica has it.
    pub fn get(&self, code: &crate::code::SessionCode, revision: u64) -> Option<Arc<Manifest>> {
        let entries = self.lock();
        entries
            .get(code)
            .filter(|(cached, _)| *cached == revision)
            .map(|(_, manifest)| Arc::clone(manifest))
    }

    /// The newest compiled manifest of `code` this replica has, with its revision.
    pub fn latest(&self, code: &crate::code::SessionCode) -> Option<(u64, Arc<Manifest>)> {
        let entries = self.lock();
        entries
            .get(code)
            .map(|(revision, manifest)| (*revision, Arc::clone(manifest)))
    }

    /// The compiled manifest whose JSON is `json`: the one sessions use already, or the one
    /// `compile` makes (kept for the next session that registers the same tools).
    pub fn shared<E>(
        &self,
        json: &str,
        compile: impl FnOnce() -> Result<Manifest, E>,
    ) -> Result<Arc<Manifest>, E> {
        if let Some(manifest) = self
            .lock_shared()
            .get(json)
            .and_then(std::sync::Weak::upgrade)
        {
            return Ok(manifest);
        }
        // Compiled without the lock: schemas take a while, and two sessions compiling the
        // same tools at once only waste a little work.
        let manifest = Arc::new(compile()?);
        let mut shared = self.lock_shared();
        if let Some(existing) = shared.get(json).and_then(std::sync::Weak::upgrade) {
            return Ok(existing);
        }
        if shared.len() >= SHARED_PRUNE_AT && shared.len().is_power_of_two() {
            shared.retain(|_, manifest| manifest.strong_count() > 0);
        }
        shared.insert(json.to_owned(), Arc::downgrade(&manifest));
        Ok(manifest)
    }

    /// Keeps `manifest` as the one of `code` at `revision` (a newer revision replaces it).
    pub fn put(&self, code: &crate::code::SessionCode, revision: u64, manifest: Arc<Manifest>) {
        let mut entries = self.lock();
        if entries.len() >= CACHED_MANIFESTS && !entries.contains_key(code) {
            // Full: drop one (any; an evicted manifest is compiled again on its next call).
            if let Some(victim) = entries.keys().next().cloned() {
                entries.remove(&victim);
            }
        }
        match entries.get(code) {
            Some((cached, _)) if *cached > revision => {}
            _ => {
                entries.insert(code.clone(), (revision, manifest));
            }
        }
    }

    fn lock_shared(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, std::sync::Weak<Manifest>>>
    {
        self.shared
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<
        '_,
        std::collections::HashMap<crate::code::SessionCode, (u64, Arc<Manifest>)>,
    > {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    /// What checking `args` costs at most, in subschemas applied to values, counting no
    /// further than `limit` (past it, `limit + 1`). Without recursion along the data every
    /// subschema applies to a value at most once, so subschemas times JSON values bounds it;
    /// with it, one schema can reach a value along several paths that each lead back to it
    /// (twice per level is 2^depth), so the applications are counted on the arguments.
    pub fn check_cost(&self, args: &Value, limit: usize) -> usize {
        if self.recursive {
            applications(&self.schema, args, limit)
        } else {
            self.schema_size
                .saturating_mul(toolrelay::json::values(args))
                .min(limit.saturating_add(1))
        }
    }

    /// [`Function::check_arguments`] within a budget: arguments that would cost more than
    /// [`MAX_CHECK_COST`] are refused before any checking, and a check that may take more
    /// than a moment (counting it included) runs on a blocking thread, so that no request can
    /// hold an async thread (and with it other requests) for long.
    pub async fn check_arguments_async(&self, args: &Value) -> Result<(), RelayError> {
        if self.check_cost(args, INLINE_CHECK_COST) <= INLINE_CHECK_COST {
            return self.check_arguments(args);
        }
        let (function, args) = (self.clone(), args.clone());
        tokio::task::spawn_blocking(move || {
            if function.check_cost(&args, MAX_CHECK_COST) > MAX_CHECK_COST {
                return Err(RelayError::InvalidArguments {
                    problems: format!(
                        "they hold {} JSON values, too many to check against this function's schema within the relay's budget; split the call into smaller ones",
                        toolrelay::json::values(&args),
                    ),
                    function: function.name,
                });
            }
            function.check_arguments(&args)
        })
        .await
        .map_err(|_| RelayError::InvalidArguments {
            function: self.name.clone(),
            problems: "checking them failed".into(),
        })?
    }
}

/// What [`schema_size`] finds out about a schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaSize {
    /// Subschemas checking one value may visit, `$ref`s followed.
    pub subschemas: usize,
    /// Whether a `$ref` leads back to a schema it is part of, for a part of the value.
    pub recursive: bool,
}

/// How many subschemas checking an argument value against `schema` may visit: every
/// subschema once, `$ref`s followed (so a `$ref` used twice counts its target twice), and a
/// `$ref` back to a schema it is part of, for a part of the value (recursion along the data),
/// once. Fails, naming the limit, past `limit` subschemas, on a `$ref` that loops back to a
/// schema applying to the same value (an endless check), or on a `$ref` that is not local to
/// the schema.
pub fn schema_size(schema: &Value, limit: usize) -> Result<SchemaSize, String> {
    let mut walk = SchemaWalk {
        root: schema,
        limit,
        visited: 0,
        descents: 0,
        following: Vec::new(),
        recursive: false,
    };
    walk.visit(schema)?;
    Ok(SchemaSize {
        subschemas: walk.visited,
        recursive: walk.recursive,
    })
}

/// The walk of [`schema_size`].
struct SchemaWalk<'a> {
    root: &'a Value,
    limit: usize,
    visited: usize,
    /// Keywords on the current path that apply their schema to a part of the value
    /// (`properties`, `items`, …): a `$ref` cycle through one of them ends with the data.
    descents: usize,
    /// The `$ref` targets being followed, with `descents` when each was entered.
    following: Vec<(String, usize)>,
    /// Whether a `$ref` cycle through a part of the value was found.
    recursive: bool,
}

impl<'a> SchemaWalk<'a> {
    fn visit(&mut self, schema: &'a Value) -> Result<(), String> {
        self.visited += 1;
        if self.visited > self.limit {
            return Err(format!(
                "it expands to more than {} subschemas once its $refs and anyOf/allOf/oneOf branches are followed (the limit); share less through $ref or simplify it",
                self.limit
            ));
        }
        let Value::Object(keywords) = schema else {
            return Ok(());
        };
        for (keyword, value) in keywords {
            match keyword.as_str() {
                // Applied to the same value.
                "allOf" | "anyOf" | "oneOf" => self.each(value, false)?,
                "not" | "if" | "then" | "else" => self.visit(value)?,
                "dependentSchemas" | "dependencies" => self.members(value, false)?,
                "$ref" | "$dynamicRef" | "$recursiveRef" => self.follow(value)?,
                // Applied to parts of the value.
                "properties" | "patternProperties" => self.members(value, true)?,
                "items" | "prefixItems" => self.each(value, true)?,
                "additionalProperties"
                | "unevaluatedProperties"
                | "propertyNames"
                | "additionalItems"
                | "unevaluatedItems"
                | "contains" => self.descend(value)?,
                // `$defs`, `definitions`: only reached through a `$ref`.
                _ => {}
            }
        }
        Ok(())
    }

    /// A schema, or each schema of an array of them.
    fn each(&mut self, value: &'a Value, descends: bool) -> Result<(), String> {
        match value {
            Value::Array(schemas) => schemas
                .iter()
                .try_for_each(|schema| self.apply(schema, descends)),
            schema => self.apply(schema, descends),
        }
    }

    /// Each schema of an object of them (an array, in `dependencies`, is not a schema).
    fn members(&mut self, value: &'a Value, descends: bool) -> Result<(), String> {
        let Value::Object(members) = value else {
            return Ok(());
        };
        members
            .values()
            .filter(|schema| schema.is_object() || schema.is_boolean())
            .try_for_each(|schema| self.apply(schema, descends))
    }

    fn apply(&mut self, schema: &'a Value, descends: bool) -> Result<(), String> {
        if descends {
            self.descend(schema)
        } else {
            self.visit(schema)
        }
    }

    fn descend(&mut self, schema: &'a Value) -> Result<(), String> {
        self.descents += 1;
        let visited = self.visit(schema);
        self.descents -= 1;
        visited
    }

    fn follow(&mut self, reference: &'a Value) -> Result<(), String> {
        let Some(reference) = reference.as_str() else {
            return Err("a $ref must be a string".into());
        };
        let (key, target) = resolve(self.root, reference)?;
        if let Some((_, entered_at)) = self.following.iter().find(|(seen, _)| *seen == key) {
            return if self.descents > *entered_at {
                // Recursion along the data (a tree of objects): it ends where the data does,
                // and what it costs is counted on the data (`applications`).
                self.recursive = true;
                Ok(())
            } else {
                Err(format!(
                    "its $ref {reference} refers back to a schema for the same value, so checking would never end"
                ))
            };
        }
        self.following.push((key, self.descents));
        let visited = self.visit(target);
        self.following.pop();
        visited
    }
}

/// The schema a local `$ref` (`#`, `#/json/pointer`, `#anchor`) of `root` points at, with a key
/// naming it.
fn resolve<'a>(root: &'a Value, reference: &str) -> Result<(String, &'a Value), String> {
    let Some(fragment) = reference.strip_prefix('#') else {
        return Err(format!(
            "its $ref {reference} is not local to the schema; only references such as #/$defs/name are supported"
        ));
    };
    let target = if fragment.is_empty() || fragment.starts_with('/') {
        let pointer = percent_decoded(fragment);
        root.pointer(&pointer)
    } else {
        find_anchor(root, fragment)
    };
    target
        .map(|target| (format!("#{fragment}"), target))
        .ok_or_else(|| format!("its $ref {reference} points at nothing in the schema"))
}

/// How many times checking `value` against `schema` applies a subschema to a value, counted
/// no further than `limit` (past it, `limit + 1`). Every applicator keyword is followed into
/// every part of the value it may apply to (more than a validator visits, never less), with
/// the schema's local `$ref`s resolved. What a `$ref`'s target costs for a part of the value is
/// counted once and remembered, so counting a schema that reaches a value along exponentially
/// many paths takes time in proportion to the schema and the value, and never more than
/// `limit` steps.
pub fn applications(schema: &Value, value: &Value, limit: usize) -> usize {
    let mut count = Applications {
        root: schema,
        limit,
        steps: 0,
        known: HashMap::new(),
    };
    count
        .apply(schema, value)
        .map_or(limit.saturating_add(1), |total| {
            total.min(limit.saturating_add(1))
        })
}

/// The count of [`applications`]; `Err` says that the limit was passed.
struct Applications<'a> {
    root: &'a Value,
    limit: usize,
    /// Subschemas walked so far (a remembered `$ref` is not walked again).
    steps: usize,
    /// What each `$ref` target costs for each part of the value (`None` while it is counted).
    known: HashMap<(*const Value, *const Value), Option<usize>>,
}

/// Stands for a property name, to which `propertyNames` applies its schema.
const A_NAME: Value = Value::String(String::new());

impl<'a> Applications<'a> {
    fn apply(&mut self, schema: &'a Value, value: &Value) -> Result<usize, ()> {
        self.steps += 1;
        if self.steps > self.limit {
            return Err(());
        }
        let Value::Object(keywords) = schema else {
            return Ok(1);
        };
        let (items, members): (&[Value], Option<&Map<String, Value>>) = match value {
            Value::Array(items) => (items, None),
            Value::Object(members) => (&[], Some(members)),
            _ => (&[], None),
        };
        let mut total: usize = 1;
        for (keyword, sub) in keywords {
            match keyword.as_str() {
                "allOf" | "anyOf" | "oneOf" => match sub {
                    Value::Array(schemas) => {
                        for schema in schemas {
                            self.add(&mut total, schema, value)?;
                        }
                    }
                    schema => self.add(&mut total, schema, value)?,
                },
                "not" | "if" | "then" | "else" => self.add(&mut total, sub, value)?,
                "dependentSchemas" | "dependencies" => {
                    if let Value::Object(schemas) = sub {
                        for schema in schemas.values().filter(|s| s.is_object()) {
                            self.add(&mut total, schema, value)?;
                        }
                    }
                }
                "$ref" | "$dynamicRef" | "$recursiveRef" => {
                    // Registration refused what does not resolve.
                    if let Some(Ok((_, target))) = sub.as_str().map(|r| resolve(self.root, r)) {
                        let cost = self.referenced(target, value)?;
                        self.count(&mut total, cost)?;
                    }
                }
                "properties" => {
                    if let (Some(members), Value::Object(schemas)) = (members, sub) {
                        for (name, schema) in schemas {
                            if let Some(member) = members.get(name) {
                                self.add(&mut total, schema, member)?;
                            }
                        }
                    }
                }
                // Every pattern is taken to match every name.
                "patternProperties" => {
                    if let (Some(members), Value::Object(schemas)) = (members, sub) {
                        for schema in schemas.values() {
                            for member in members.values() {
                                self.add(&mut total, schema, member)?;
                            }
                        }
                    }
                }
                "additionalProperties" | "unevaluatedProperties" => {
                    for member in members.into_iter().flat_map(Map::values) {
                        self.add(&mut total, sub, member)?;
                    }
                }
                "propertyNames" => {
                    for _ in members.into_iter().flat_map(Map::keys) {
                        self.add(&mut total, sub, &A_NAME)?;
                    }
                }
                "items" | "prefixItems" => match sub {
                    Value::Array(schemas) => {
                        for (schema, item) in schemas.iter().zip(items) {
                            self.add(&mut total, schema, item)?;
                        }
                    }
                    schema => {
                        for item in items {
                            self.add(&mut total, schema, item)?;
                        }
                    }
                },
                "additionalItems" | "unevaluatedItems" | "contains" => {
                    for item in items {
                        self.add(&mut total, sub, item)?;
                    }
                }
                _ => {}
            }
        }
        Ok(total)
    }

    /// Adds what applying `schema` to `value` costs to `total`.
    fn add(&mut self, total: &mut usize, schema: &'a Value, value: &Value) -> Result<(), ()> {
        let cost = self.apply(schema, value)?;
        self.count(total, cost)
    }

    fn count(&self, total: &mut usize, cost: usize) -> Result<(), ()> {
        *total = total.saturating_add(cost);
        if *total > self.limit { Err(()) } else { Ok(()) }
    }

    /// What `target` (a `$ref`'s) costs for `value`, counted the first time only.
    fn referenced(&mut self, target: &'a Value, value: &Value) -> Result<usize, ()> {
        let key = (std::ptr::from_ref(target), std::ptr::from_ref(value));
        match self.known.get(&key) {
            Some(Some(cost)) => return Ok(*cost),
            // A loop on the same value, which registration refuses.
            Some(None) => return Err(()),
            None => {}
        }
        self.known.insert(key, None);
        let cost = self.apply(target, value)?;
        self.known.insert(key, Some(cost));
        Ok(cost)
    }
}

/// A JSON pointer from a URI fragment, with `%XX` escapes decoded.
fn percent_decoded(fragment: &str) -> String {
    let bytes = fragment.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = bytes
            .get(index + 1..index + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[index], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                index += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// The subschema declaring the anchor `name` (`$anchor`, `$dynamicAnchor`, or an `$id` of
/// `#name` in older drafts).
fn find_anchor<'a>(root: &'a Value, name: &str) -> Option<&'a Value> {
    let mut stack = vec![root];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                let declares = |key: &str, expected: &str| {
                    map.get(key).and_then(Value::as_str) == Some(expected)
                };
                if declares("$anchor", name)
                    || declares("$dynamicAnchor", name)
                    || declares("$id", &format!("#{name}"))
                {
                    return Some(value);
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    None
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
        max_depth: 32,
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
    fn sessions_with_the_same_tools_share_one_compiled_manifest() {
        let cache = ManifestCache::default();
        let compiled = |tools: &Value| {
            let manifest = Manifest::parse(tools, LIMITS).unwrap();
            let json = manifest.to_json();
            cache
                .shared(&json, || Ok::<_, RelayError>(manifest))
                .unwrap()
        };
        let first = compiled(&grouped());
        let second = compiled(&grouped());
        assert!(
            Arc::ptr_eq(&first, &second),
            "the same tools compiled twice"
        );
        // From the store's JSON (another replica registered them): the same copy again.
        let stored = cache
            .shared(&first.to_json(), || -> Result<Manifest, RelayError> {
                panic!("compiled again")
            })
            .unwrap();
        assert!(Arc::ptr_eq(&first, &stored));
        let mut other = grouped();
        other["tools"][0]["functions"][0]["name"] = json!("removePerson");
        assert!(!Arc::ptr_eq(&first, &compiled(&other)));
        // Once no session uses it, the next registration compiles it afresh.
        let json = first.to_json();
        drop((first, second, stored));
        let mut compiles = 0;
        cache
            .shared(&json, || {
                compiles += 1;
                Manifest::from_json(&json, LIMITS)
            })
            .unwrap();
        assert_eq!(compiles, 1);
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
    fn a_stored_manifest_reads_back_the_same() {
        let mixed = json!({"version": "3", "tools": [
            {"id": "people", "description": "People", "functions": [{"name": "add", "description": "Adds",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}]},
            {"name": "ping", "description": "Answers pong"}
        ]});
        let manifest = Manifest::parse(&mixed, LIMITS).unwrap();
        let again = Manifest::from_json(&manifest.to_json(), LIMITS).unwrap();
        assert_eq!(again.grouped(), manifest.grouped());
        assert_eq!(again.flat(), manifest.flat());
        assert!(again.function(Some("ping"), "ping").is_some());
        assert!(
            again
                .function(None, "add")
                .unwrap()
                .check_arguments(&json!({"n": "x"}))
                .is_err()
        );
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
                "not local to the schema",
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
