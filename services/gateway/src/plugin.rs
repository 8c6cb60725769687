//! The CODAP plugin: static files embedded in the binary (no build step) and served at
//! `/codap/`. CODAP loads it with `https://codap.concord.org/app/?di=<relay>/codap/`.

use poem::http::{StatusCode, header};
use poem::web::{Data, Path};
use poem::{Response, handler};

use crate::api::State;

/// The plugin's files: name, content type, content.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../plugin/index.html"),
    ),
    (
        "plugin.css",
        "text/css; charset=utf-8",
        include_str!("../plugin/plugin.css"),
    ),
    (
        "main.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/main.js"),
    ),
    (
        "codap.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/codap.js"),
    ),
    (
        "dispatcher.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/dispatcher.js"),
    ),
    (
        "session.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/session.js"),
    ),
    (
        "tools.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/tools.js"),
    ),
    (
        "transport.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/transport.js"),
    ),
    (
        "errors.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/errors.js"),
    ),
];

/// The page people see when they open the relay's address: what this is, and where to go.
const LANDING: &str = include_str!("landing.html");

/// The page of `GET /`: what this server is, with the plugin, the connector URL, the GPT
/// Actions file and the API documents, all under the public base URL.
pub fn landing_page(public_base_url: &str) -> String {
    LANDING.replace("{{BASE}}", &escape_html(public_base_url))
}

/// `text` safe inside HTML text and attribute values.
fn escape_html(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `/codap` → `/codap/`, so relative URLs resolve.
#[handler]
pub fn plugin_root() -> Response {
    Response::builder()
        .status(StatusCode::MOVED_PERMANENTLY)
        .header(header::LOCATION, "/codap/")
        .finish()
}

/// `/codap/` — the page.
#[handler]
pub fn plugin_index(Data(state): Data<&State>) -> Response {
    serve("index.html", state)
}

/// `/codap/{file}`.
#[handler]
pub fn plugin_file(Path(file): Path<String>, Data(state): Data<&State>) -> Response {
    serve(&file, state)
}

fn serve(name: &str, state: &State) -> Response {
    let Some((_, content_type, body)) = FILES.iter().find(|(file, _, _)| *file == name) else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .content_type("text/plain; charset=utf-8")
            .body("No such file in the plugin.");
    };
    // Only CODAP (the configured origins) and the relay itself may frame the plugin: its
    // buttons end sessions and allow changes, so a foreign page must not overlay them.
    let ancestors = std::iter::once("'self'")
        .chain(state.config.cors_origins.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ");
    let policy = format!(
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self' ws: wss:; frame-ancestors {ancestors}"
    );
    Response::builder()
        .content_type(*content_type)
        .header(header::CACHE_CONTROL, "no-cache")
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff")
        .header(header::CONTENT_SECURITY_POLICY, policy)
        .body(*body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_module_the_page_imports_is_served() {
        let served: Vec<&str> = FILES.iter().map(|(name, _, _)| *name).collect();
        for (_, _, body) in FILES {
            for line in body.lines().filter(|line| line.starts_with("import ")) {
                let target = line
                    .rsplit("'./")
                    .next()
                    .and_then(|rest| rest.split('\'').next())
                    .unwrap_or_default();
                assert!(
                    served.contains(&target),
                    "{target} is imported but not served"
                );
            }
        }
        assert!(FILES[0].2.contains("main.js") && FILES[0].2.contains("plugin.css"));
    }

    #[test]
    fn the_plugins_error_names_are_the_relays() {
        let (_, _, errors) = FILES
            .iter()
            .find(|(name, _, _)| *name == "errors.js")
            .expect("errors.js is served");
        let listed: Vec<(String, String)> = errors
            .lines()
            .filter_map(|line| {
                let (key, value) = line.trim().split_once(": '")?;
                Some((key.to_owned(), value.strip_suffix("',")?.to_owned()))
            })
            .collect();
        let expected: Vec<(String, String)> = toolrelay_relay::ErrorCode::ALL
            .iter()
            .map(|code| (code.as_str().to_uppercase(), code.as_str().to_owned()))
            .collect();
        assert_eq!(
            listed, expected,
            "plugin/errors.js must list ErrorCode::ALL, in order"
        );
    }
}
