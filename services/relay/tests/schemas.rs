//! Hostile manifests: schemas whose checks would cost exponential time are refused when they
//! are registered, and every schema that is accepted checks arguments within a small budget.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolrelay_relay::manifest::{MAX_SCHEMA_NODES, Manifest, ManifestLimits, schema_size};

const LIMITS: ManifestLimits = ManifestLimits {
    max_bytes: 256 * 1024,
    max_functions: 8,
    max_depth: 32,
};

/// A manifest with one function `f` taking arguments of `schema`.
fn manifest(schema: Value) -> Value {
    json!([{"name": "f", "description": "hostile", "inputSchema": schema}])
}

/// The attack: `levels` definitions, each combining the one below twice, so that checking a
/// value walks 2^levels subschemas (`combinator` is anyOf, allOf or oneOf).
fn doubling(levels: usize, combinator: &str) -> Value {
    let mut defs = Map::new();
    defs.insert("l0".into(), json!({"type": "integer"}));
    for level in 1..=levels {
        let below = format!("#/$defs/l{}", level - 1);
        defs.insert(
            format!("l{level}"),
            json!({combinator: [{"$ref": below}, {"$ref": below}]}),
        );
    }
    json!({
        "type": "object",
        "$defs": defs,
        "properties": {"x": {"$ref": format!("#/$defs/l{levels}")}},
    })
}

#[test]
fn the_exponential_schema_is_refused_at_registration_and_says_which_limit() {
    for combinator in ["anyOf", "allOf", "oneOf"] {
        // 2.6 KB of JSON, hours of checking in the report that found it.
        let schema = doubling(40, combinator);
        assert!(schema.to_string().len() < 4 * 1024);
        let started = Instant::now();
        let error = Manifest::parse(&manifest(schema), LIMITS).unwrap_err();
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "refusing is cheap"
        );
        assert_eq!(error.name(), "invalid_manifest");
        let message = error.to_string();
        assert!(
            message.contains(&MAX_SCHEMA_NODES.to_string()) && message.contains("subschemas"),
            "{message}"
        );
    }
}

#[test]
fn a_schema_at_the_limit_is_accepted_and_checks_fast() {
    // 2^10 = 1024 leaves, each reached through a $ref: about 4100 subschemas, under the
    // limit of 5000.
    let schema = doubling(10, "allOf");
    let size = schema_size(&schema, MAX_SCHEMA_NODES).unwrap();
    assert!((4000..=MAX_SCHEMA_NODES).contains(&size), "{size}");
    let parsed = Manifest::parse(&manifest(schema), LIMITS).unwrap();
    let function = parsed.function(None, "f").unwrap();
    let started = Instant::now();
    function.check_arguments(&json!({"x": 3})).unwrap();
    let error = function
        .check_arguments(&json!({"x": "three"}))
        .unwrap_err();
    assert_eq!(error.name(), "invalid_arguments");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(function.check_cost(&json!({"x": 3})), size * 2);
}

#[test]
fn refs_that_loop_on_the_same_value_are_refused_and_recursion_along_the_data_is_not() {
    let endless = json!({
        "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
        "properties": {"x": {"$ref": "#/$defs/a"}}
    });
    let error = Manifest::parse(&manifest(endless), LIMITS).unwrap_err();
    assert!(error.to_string().contains("never end"), "{error}");

    let tree = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#"}}
        }
    });
    let parsed = Manifest::parse(&manifest(tree), LIMITS).unwrap();
    let function = parsed.function(None, "f").unwrap();
    function
        .check_arguments(
            &json!({"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}),
        )
        .unwrap();
    assert!(
        function
            .check_arguments(&json!({"children": [{"name": 3}]}))
            .is_err()
    );
}

#[test]
fn remote_and_dangling_refs_and_deep_schemas_are_refused_with_the_reason() {
    let cases = [
        (json!({"$ref": "https://example.com/s.json"}), "not local"),
        (
            json!({"properties": {"x": {"$ref": "#/$defs/missing"}}}),
            "points at nothing",
        ),
    ];
    for (schema, expected) in cases {
        let error = Manifest::parse(&manifest(schema), LIMITS).unwrap_err();
        assert!(error.to_string().contains(expected), "{error}");
    }
    let mut deep = json!({"type": "string"});
    for _ in 0..20 {
        deep = json!({"type": "object", "properties": {"x": deep}});
    }
    let error = Manifest::parse(&manifest(deep), LIMITS).unwrap_err();
    assert!(error.to_string().contains("nested more than 32"), "{error}");
}

/// Schemas built from the keywords that multiply work: combinators, `$ref`s to shared
/// definitions (which may point at each other), properties and items.
fn schema_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "integer"})),
        Just(json!({"type": "string", "maxLength": 5})),
        Just(json!(true)),
        (0..6usize).prop_map(|n| json!({"$ref": format!("#/$defs/d{n}")})),
    ];
    let node = leaf.prop_recursive(6, 64, 4, |inner| {
        prop_oneof![
            (
                prop_oneof![Just("anyOf"), Just("allOf"), Just("oneOf")],
                prop::collection::vec(inner.clone(), 1..4)
            )
                .prop_map(|(combinator, items)| json!({combinator: items})),
            prop::collection::vec(inner.clone(), 1..3).prop_map(|items| {
                let properties: Map<String, Value> = items
                    .into_iter()
                    .enumerate()
                    .map(|(i, schema)| (format!("p{i}"), schema))
                    .collect();
                json!({"type": "object", "properties": properties})
            }),
            inner
                .clone()
                .prop_map(|items| json!({"type": "array", "items": items})),
            inner.prop_map(|schema| json!({"not": schema})),
        ]
    });
    (prop::collection::vec(node.clone(), 6), node).prop_map(|(defs, root)| {
        let defs: Map<String, Value> = defs
            .into_iter()
            .enumerate()
            .map(|(i, schema)| (format!("d{i}"), schema))
            .collect();
        json!({"type": "object", "$defs": defs, "properties": {"x": root, "y": {"$ref": "#/$defs/d0"}}})
    })
}

/// Arguments shaped to go deep into such schemas.
fn arguments_strategy() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        "[a-z]{0,8}".prop_map(Value::String),
        Just(Value::Null),
    ];
    let value = leaf.prop_recursive(5, 200, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec(inner, 0..4).prop_map(|items| {
                let object: Map<String, Value> = items
                    .into_iter()
                    .enumerate()
                    .map(|(i, value)| (format!("p{i}"), value))
                    .collect();
                Value::Object(object)
            }),
        ]
    });
    (value.clone(), value).prop_map(|(x, y)| json!({"x": x, "y": y}))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever is registered, every check of an accepted schema stays within the budget:
    /// its size is bounded at registration, and checking visits each subschema at most
    /// once per argument value, which is what `check_cost` counts. A generous time limit
    /// catches anything that escapes the count.
    #[test]
    fn every_accepted_schema_checks_within_its_budget(
        schema in schema_strategy(),
        args in arguments_strategy(),
    ) {
        let Ok(parsed) = Manifest::parse(&manifest(schema), LIMITS) else {
            return Ok(());
        };
        let function = parsed.function(None, "f").unwrap();
        prop_assert!(function.schema_size <= MAX_SCHEMA_NODES);
        let cost = function.check_cost(&args);
        prop_assert!(cost <= MAX_SCHEMA_NODES * toolrelay::json::values(&args));
        let started = Instant::now();
        let _ = function.check_arguments(&args);
        prop_assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    }
}
