//! The checked-in OpenAPI documents match the code, and the GPT Actions document follows the
//! rules ChatGPT imports by.
//!
//! When the API changes, regenerate the files with
//! `UPDATE_OPENAPI=1 cargo test -p toolrelay-gateway --test openapi` and commit them.
#![allow(clippy::unwrap_used)] // a test that cannot unwrap should fail loudly

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::Value;
use toolrelay_gateway::config::GatewayConfig;
use toolrelay_gateway::server::{Documents, gateway};
use toolrelay_relay::builtin::Registry;
use toolrelay_relay::server::memory_relay;
use toolrelay_relay::{RelayApi, RelayConfig};

/// The base URL the checked-in documents name (the default `toolrelay` address).
const DOCUMENTED_BASE: &str = "http://127.0.0.1:8080";
/// GPT Actions refuse longer summaries and descriptions.
const MAX_TEXT: usize = 300;

fn repo_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../openapi")
        .join(name)
}

fn documents() -> Vec<(&'static str, String)> {
    let metrics = toolrelay_relay::Metrics::default();
    let relay = memory_relay(RelayConfig::default(), Registry::default(), &metrics);
    let store = Arc::clone(relay.store());
    let state = gateway(
        RelayApi::Local(relay),
        GatewayConfig::new(DOCUMENTED_BASE).unwrap(),
        toolrelay_relay::Drain::new(),
        store,
        metrics,
    );
    let documents = Documents::of(&state);
    vec![
        ("openapi.json", documents.openapi_json),
        ("actions.json", documents.actions_json),
    ]
}

#[tokio::test]
async fn checked_in_documents_match_the_code() {
    for (name, generated) in documents() {
        let path = repo_file(name);
        let generated = format!("{generated}\n");
        if std::env::var_os("UPDATE_OPENAPI").is_some() {
            std::fs::write(&path, &generated).unwrap();
            continue;
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == generated,
            "openapi/{name} is out of date with the code. Regenerate it with\n  UPDATE_OPENAPI=1 cargo test -p toolrelay-gateway --test openapi\nand commit the result."
        );
    }
}

#[tokio::test]
async fn the_actions_document_is_importable_as_gpt_actions() {
    let (_, actions) = documents().remove(1);
    let actions: Value = serde_json::from_str(&actions).unwrap();
    assert_eq!(actions["servers"][0]["url"], DOCUMENTED_BASE);
    let mut ids = HashSet::new();
    for (path, item) in actions["paths"].as_object().unwrap() {
        assert!(
            path.starts_with("/api/sessions/{code}"),
            "{path}: LLM operations take the code in the path"
        );
        for (method, operation) in item.as_object().unwrap() {
            let id = operation["operationId"].as_str().unwrap();
            assert!(ids.insert(id.to_owned()), "operationId {id} is not unique");
            for field in ["summary", "description"] {
                let text = operation[field].as_str().unwrap_or_default();
                assert!(
                    text.len() <= MAX_TEXT,
                    "{method} {path} {field} is {} characters",
                    text.len()
                );
            }
            assert!(
                !operation["summary"].as_str().unwrap_or_default().is_empty(),
                "{method} {path} has a summary"
            );
            // ChatGPT asks the person before a consequential call: never for a read.
            let reads = method == "get" || id == "readTool";
            assert_eq!(
                operation["x-openai-isConsequential"],
                Value::Bool(!reads),
                "{method} {path} ({id})"
            );
            for parameter in operation["parameters"].as_array().into_iter().flatten() {
                assert_ne!(
                    parameter["in"], "header",
                    "{method} {path}: the LLM side needs no custom headers"
                );
            }
        }
    }
    for expected in [
        "getMetadata",
        "callTool",
        "readTool",
        "queueCall",
        "getResponses",
        "getCall",
        "getSession",
    ] {
        assert!(ids.contains(expected), "{expected} is offered");
    }
}

#[tokio::test]
async fn every_operation_of_the_full_document_is_named_and_short() {
    let (_, full) = documents().remove(0);
    let full: Value = serde_json::from_str(&full).unwrap();
    let mut ids = HashSet::new();
    for (path, item) in full["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let id = operation["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has an operationId"));
            assert!(ids.insert(id.to_owned()), "operationId {id} is not unique");
            let summary = operation["summary"].as_str().unwrap_or_default();
            assert!(
                !summary.is_empty() && summary.len() <= MAX_TEXT,
                "{method} {path}"
            );
            assert!(
                operation["tags"]
                    .as_array()
                    .is_some_and(|tags| !tags.is_empty()),
                "{method} {path} is tagged"
            );
        }
    }
}
