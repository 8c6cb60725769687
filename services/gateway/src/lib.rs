//! The toolrelay gateway: the documented REST API, SSE and polling fallbacks, the browser
//! WebSocket on the public port, the OpenAPI spec, discovery and health.
//!
//! # Layout
//! * [`server`] — the route table ([`server::app`]), the OpenAPI documents, and [`server::run`]
//!   of a [`server::Server`]: in front of the relay in this process or of one elsewhere;
//! * [`api`] — the operations, one `#[OpenApi]` struct per audience (LLM, tab, legacy,
//!   discovery), all over [`api::Gateway`], which reaches the relay through
//!   [`toolrelay_relay::front::RelayApi`] — in-process or over gRPC, the handlers cannot tell
//!   (callTool and readTool, declared there, are served by the route table directly:
//!   [`api::llm::CallRoute`]);
//! * [`websocket`] — the provider WebSocket upgrade; [`plugin`] — the CODAP plugin's files;
//!   [`mcp`] — the MCP endpoints (`/mcp`, `/mcp/s/{handle}`);
//! * [`middleware`] — every layer around the routes, and their order in one function
//!   ([`middleware::layers`]): metrics, CORS, the `Host` and Fetch Metadata checks, API keys,
//!   the body limit;
//! * [`types`] — the JSON shapes of the API; [`error`] — error bodies and correlation ids;
//! * [`limits`] — rate limits and client addresses; [`config`] — settings and flags.
//!
//! The gateway keeps no session state: sessions, calls and answers live in the relay.

pub mod api;
pub mod config;
pub mod error;
pub mod limits;
pub mod mcp;
pub mod middleware;
pub mod plugin;
pub mod server;
pub mod types;
pub mod websocket;

#[cfg(test)]
mod tests {
    /// The gateway is a front end: of the relay crate it names only `toolrelay_relay::front`
    /// (its binary, which assembles a process, may name more).
    #[test]
    fn the_gateway_names_only_the_relays_front() {
        let mut files = vec![std::path::PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src"
        ))];
        let mut checked = 0;
        // Built here, so that this file does not name what it looks for.
        let named = ["toolrelay_relay", "::"].concat();
        let (renamed, globbed) = ([&named[..15], " as"].concat(), [&named, "*"].concat());
        while let Some(path) = files.pop() {
            if path.is_dir() {
                if path.file_name().is_some_and(|name| name == "bin") {
                    continue;
                }
                files.extend(
                    std::fs::read_dir(&path)
                        .unwrap()
                        .map(|entry| entry.unwrap().path()),
                );
                continue;
            }
            if path.extension().is_none_or(|extension| extension != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                !text.contains(&renamed) && !text.contains(&globbed),
                "{} renames or globs the relay crate",
                path.display()
            );
            for (at, _) in text.match_indices(&named) {
                let rest = &text[at + named.len()..];
                assert!(
                    rest.starts_with("front"),
                    "{} names the relay crate's {}: use what its `front` module gives",
                    path.display(),
                    rest.split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                        .next()
                        .unwrap_or_default()
                );
            }
            checked += 1;
        }
        assert!(checked > 20, "only {checked} files read");
    }
}
