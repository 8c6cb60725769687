//! The schema cost bound: how many subschemas a schema expands to with its `$ref`s followed
//! ([`schema_size`], refused past [`MAX_SCHEMA_NODES`] at registration), and how many
//! applications checking given arguments takes when a schema recurses along the data
//! ([`applications`]).

use std::collections::HashMap;

use serde_json::{Map, Value};

/// Most subschemas a function's schema may expand to, with its `$ref`s followed.
pub const MAX_SCHEMA_NODES: usize = 5_000;

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
