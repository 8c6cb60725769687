//! The tools built into the relay, and their settings: PlantUML and MIP (a sandboxed Python
//! builds a model, HiGHS in-process or a ReMIP server solves it).
//!
//! # Layout
//! * [`plantuml`] — `encodePlantUML` and `decodePlantUML`;
//! * [`mip`] — the four MIP tools over [`mip::sandbox`] (the Python sandbox and its
//!   system-call filter), [`mip::highs`] and [`mip::remip`] (the solvers), [`mip::model`] (what
//!   they exchange) and [`mip::turns`] (the slots, shared fairly between clients);
//! * [`config`] — [`BuiltinConfig`], its checks, and the flags ([`ToolArgs`]) that fill it;
//! * [`standard`] — the registry of them all, which the binaries that run tools (package
//!   `toolrelay-server`) hand to the relay.
//!
//! The [`Tool`](toolrelay_relay::builtin::Tool) trait, the
//! [`Registry`] and everything a relay needs to run tools live in the relay crate
//! ([`toolrelay_relay::builtin`]); this crate depends on it, never the other way round, so the
//! split-mode gateway, which depends on the relay crate alone, links neither HiGHS nor the
//! sandbox. Adding a tool is one file here implementing `Tool` plus one line in [`standard`].

pub mod config;
pub mod mip;
pub mod plantuml;

use std::sync::Arc;

use toolrelay_relay::Metrics;
use toolrelay_relay::builtin::{Registry, Tool};

pub use config::{BuiltinConfig, ToolArgs};

/// Every built-in tool, reporting to `metrics`. Building it checks the MIP sandbox (and logs
/// what it finds), so the binaries build it before saying they listen.
pub fn standard(config: &BuiltinConfig, metrics: &Metrics) -> Registry {
    let mut tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(plantuml::EncodePlantUml::new(&config.plantuml_server)),
        Arc::new(plantuml::DecodePlantUml),
    ];
    tools.extend(mip::tools(&config.mip, metrics));
    Registry::new(tools)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use toolrelay_relay::Clock;
    use toolrelay_relay::builtin::{Context, FailureKind, Scope, Tickets, ToolCode};
    use toolrelay_relay::manifest::is_valid_name;
    use toolrelay_relay::store::memory::MemoryStore;

    #[test]
    fn the_standard_tools_are_well_formed() {
        let registry = standard(&BuiltinConfig::default(), &Metrics::default());
        for tool in registry.list() {
            assert!(is_valid_name(&tool.name), "{}", tool.name);
            assert_eq!(tool.input_schema["type"], "object", "{}", tool.name);
            assert!(!tool.description.is_empty());
        }
        assert!(registry.contains("encodePlantUML") && registry.contains("decodePlantUML"));
        for name in [
            "generate_mip_problem",
            "solve_mip_problem",
            "validate_mip_solution",
            "get_mip_solution",
        ] {
            assert!(registry.contains(name), "{name}");
        }
    }

    #[tokio::test]
    async fn unknown_tools_and_bad_arguments_are_refused() {
        let registry = standard(&BuiltinConfig::default(), &Metrics::default());
        let clock = Clock::new();
        let store = MemoryStore::new(clock.clone(), std::time::Duration::from_secs(60));
        let context = Context {
            scope: Scope::None,
            client: None,
            tickets: Tickets::new(store, clock),
            metrics: Metrics::default(),
        };
        let missing = registry
            .call("nope", json!({}), &context)
            .await
            .unwrap_err();
        assert_eq!(
            (missing.kind, missing.code),
            (FailureKind::NotFound, ToolCode::ToolNotFound.into())
        );
        assert!(missing.message.contains("encodePlantUML"));
        let bad = registry
            .call("encodePlantUML", json!({"plantumlCode": 5}), &context)
            .await
            .unwrap_err();
        assert_eq!(bad.code, ToolCode::InvalidArguments);
        assert!(bad.message.contains("/plantumlCode"), "{}", bad.message);
    }
}
