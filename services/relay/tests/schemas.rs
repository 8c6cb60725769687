//! Hostile manifests: schemas whose checks would cost exponential time are refused when they
//! are registered, and every schema that is accepted checks arguments within a small budget.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::time::{Duration, Instant};

use proptest::prelude::*;
use serde_json::{Map, Value, json};
use toolrelay_relay::manifest::{
    MAX_CHECK_COST, MAX_SCHEMA_NODES, Manifest, ManifestLimits, applications, schema_size,
};

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
    let size = schema_size(&schema, MAX_SCHEMA_NODES).unwrap().subschemas;
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
    assert_eq!(
        function.check_cost(&json!({"x": 3}), MAX_CHECK_COST),
        size * 2
    );
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

/// Two paths from a definition back to itself for the same part of the value: each level of
/// the arguments doubles the work, although the schema is tiny and its walk counts each
/// recursion once.
fn two_paths_back() -> Value {
    json!({
        "type": "object",
        "$defs": {"n": {"allOf": [
            {"properties": {"a": {"$ref": "#/$defs/n"}}},
            {"properties": {"a": {"$ref": "#/$defs/n"}}}
        ]}},
        "properties": {"x": {"$ref": "#/$defs/n"}}
    })
}

/// `{"x": {"a": {"a": … {} }}}`, `levels` deep under `x`.
fn chain(levels: usize) -> Value {
    let mut value = json!({});
    for _ in 0..levels {
        value = json!({"a": value});
    }
    json!({"x": value})
}

/// Runs the check on a runtime of its own and gives up (failing the test) after `limit`
/// rather than hanging when a check escapes its budget.
fn checked_within(
    function: &toolrelay_relay::manifest::Function,
    args: &Value,
    limit: Duration,
) -> Result<(), String> {
    let (function, args) = (function.clone(), args.clone());
    let (done, result) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let checked = runtime.block_on(function.check_arguments_async(&args));
        let _ = done.send(checked.map_err(|error| error.to_string()));
    });
    result
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("a check took more than {limit:?}"))
}

#[test]
fn a_schema_reaching_a_value_along_two_paths_is_counted_on_the_arguments() {
    let schema = two_paths_back();
    let size = schema_size(&schema, MAX_SCHEMA_NODES).unwrap();
    assert!(size.recursive && size.subschemas < 20, "{size:?}");
    let parsed = Manifest::parse(&manifest(schema.clone()), LIMITS).unwrap();
    let function = parsed.function(None, "f").unwrap();

    // Shallow arguments are checked as usual, and what they cost is what they cost.
    checked_within(function, &chain(4), Duration::from_secs(10)).unwrap();
    let cost = function.check_cost(&chain(4), MAX_CHECK_COST);
    assert_eq!(cost, applications(&schema, &chain(4), MAX_CHECK_COST));
    assert!((2usize.pow(4)..2usize.pow(8)).contains(&cost), "{cost}");

    // 30 levels would be 2^30 applications (minutes): refused at once, saying what to do.
    let started = Instant::now();
    let error = checked_within(function, &chain(30), Duration::from_secs(10)).unwrap_err();
    assert!(error.contains("split the call"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        function.check_cost(&chain(30), MAX_CHECK_COST),
        MAX_CHECK_COST + 1
    );
}

#[test]
fn a_tree_of_objects_costs_what_its_values_are() {
    // Recursion along the data with one path back per part of the value: linear.
    let tree = json!({
        "type": "object",
        "properties": {
            "value": {"type": "integer"},
            "left": {"$ref": "#"},
            "right": {"$ref": "#"}
        }
    });
    fn grown(levels: usize) -> Value {
        if levels == 0 {
            return json!({"value": 1});
        }
        json!({"value": 1, "left": grown(levels - 1), "right": grown(levels - 1)})
    }
    let parsed = Manifest::parse(&manifest(tree.clone()), LIMITS).unwrap();
    let function = parsed.function(None, "f").unwrap();
    let args = grown(12);
    let values = toolrelay::json::values(&args);
    let cost = function.check_cost(&args, MAX_CHECK_COST);
    assert!(cost <= 8 * values, "{cost} for {values} values");
    checked_within(function, &args, Duration::from_secs(10)).unwrap();
    let mut wrong = grown(3);
    wrong["left"]["right"]["value"] = json!("one");
    let error = checked_within(function, &wrong, Duration::from_secs(10)).unwrap_err();
    assert!(error.contains("/left/right/value"), "{error}");
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

/// Arguments shaped to go deep into such schemas: a mixed value a few levels deep, and a
/// chain of objects up to 30 levels deep along the schemas' property names.
fn arguments_strategy() -> impl Strategy<Value = Value> {
    let chain = (prop::collection::vec(0..3usize, 0..30), any::<i64>()).prop_map(|(path, end)| {
        path.into_iter()
            .fold(json!(end), |inner, key| json!({format!("p{key}"): inner}))
    });
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
    (
        prop_oneof![value.clone(), chain.clone()],
        prop_oneof![value, chain],
    )
        .prop_map(|(x, y)| json!({"x": x, "y": y}))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever is registered, every check of an accepted schema stays within the budget.
    /// Without recursion along the data, the static bound the relay relies on (subschemas
    /// times argument values) holds for the applications counted on the arguments; with it,
    /// the relay counts them on the arguments and refuses what is over the budget. A generous
    /// time limit catches anything that escapes the count.
    #[test]
    fn every_accepted_schema_checks_within_its_budget(
        schema in schema_strategy(),
        args in arguments_strategy(),
    ) {
        let Ok(parsed) = Manifest::parse(&manifest(schema.clone()), LIMITS) else {
            return Ok(());
        };
        let function = parsed.function(None, "f").unwrap();
        let size = schema_size(&function.schema, MAX_SCHEMA_NODES).unwrap();
        prop_assert!(size.subschemas <= MAX_SCHEMA_NODES);
        if !size.recursive {
            let bound = size.subschemas * toolrelay::json::values(&args);
            prop_assert!(applications(&function.schema, &args, bound) <= bound);
        }
        let _ = checked_within(function, &args, Duration::from_secs(2));
    }
}
