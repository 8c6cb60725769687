//! Unit tests of parsing, the cache and argument checks.

use serde_json::json;

use super::*;
use crate::error::RelayError;

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

#[test]
fn what_a_function_does_to_data_is_kept_and_checked() {
    let tools = json!([
        {"name": "countCases", "title": "Count cases", "readOnly": true, "untrustedContent": true},
        {"name": "createGraph", "destructive": false},
        {"name": "deleteCases", "destructive": true, "idempotent": true},
        {"name": "codapRequest"}
    ]);
    let manifest = Manifest::parse(&tools, LIMITS).unwrap();
    let again = Manifest::from_json(&manifest.to_json(), LIMITS).unwrap();
    for manifest in [&manifest, &again] {
        let hints = |name| manifest.function(None, name).unwrap().hints.clone();
        assert_eq!(hints("countCases").title.as_deref(), Some("Count cases"));
        assert!(hints("countCases").is_read_only() && hints("countCases").is_untrusted());
        assert!(!hints("createGraph").destructive_hint());
        assert!(hints("deleteCases").destructive_hint() && hints("deleteCases").idempotent_hint());
        assert_eq!(hints("codapRequest"), ToolHints::default());
        assert!(hints("codapRequest").destructive_hint());
    }
    let flat = manifest.flat();
    assert_eq!(flat.tools[0].hints.read_only, Some(true));
    for (bad, says) in [
        (
            json!([{"name": "f", "readOnly": "yes"}]),
            "tools[0].readOnly must be true or false",
        ),
        (
            json!([{"name": "f", "title": ""}]),
            "tools[0].title must be a string",
        ),
        (
            json!([{"name": "f", "readOnly": true, "destructive": true}]),
            "both readOnly and destructive",
        ),
    ] {
        let error = Manifest::parse(&bad, LIMITS).unwrap_err().to_string();
        assert!(error.contains(says), "{error}");
    }
}
