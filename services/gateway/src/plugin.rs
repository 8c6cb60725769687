//! The pages and scripts the relay serves, embedded in the binary (no build step): the CODAP
//! plugin at `/codap/` (CODAP loads it with `https://codap.concord.org/app/?di=<relay>/codap/`),
//! the browser SDK at `/sdk/` (open to every origin: pages elsewhere import it) and the demo
//! page at `/demo/`. The plugin and the demo are built on the SDK.

use poem::http::{StatusCode, header};
use poem::web::{Data, Path};
use poem::{Response, handler};

use crate::api::State;

/// A file served as is: name, content type, content.
type File = (&'static str, &'static str, &'static str);

/// The plugin's own files (`/codap/`); it imports the SDK from `/sdk/`.
const PLUGIN: &[File] = &[
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
        "tools.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/tools.js"),
    ),
    (
        "graph-image.js",
        "text/javascript; charset=utf-8",
        include_str!("../plugin/graph-image.js"),
    ),
];

/// The browser SDK (`/sdk/`): any page, on any origin, imports `/sdk/toolrelay.js`.
const SDK: &[File] = &[
    (
        "toolrelay.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/toolrelay.js"),
    ),
    (
        "connection.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/connection.js"),
    ),
    (
        "transport.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/transport.js"),
    ),
    (
        "transport-websocket.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/transport-websocket.js"),
    ),
    (
        "transport-sse.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/transport-sse.js"),
    ),
    (
        "transport-polling.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/transport-polling.js"),
    ),
    (
        "session.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/session.js"),
    ),
    (
        "dispatcher.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/dispatcher.js"),
    ),
    (
        "errors.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/errors.js"),
    ),
    (
        "pairing.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/pairing.js"),
    ),
    (
        "pairing-text.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/pairing-text.js"),
    ),
    (
        "pairing.css",
        "text/css; charset=utf-8",
        include_str!("../sdk/pairing.css"),
    ),
    (
        "webmcp.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/webmcp.js"),
    ),
    (
        "result.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/result.js"),
    ),
    (
        "progress.js",
        "text/javascript; charset=utf-8",
        include_str!("../sdk/progress.js"),
    ),
];

/// The demo page (`/demo/`): a shared list an assistant fills through the SDK.
const DEMO: &[File] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../demo/index.html"),
    ),
    (
        "demo.css",
        "text/css; charset=utf-8",
        include_str!("../demo/demo.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../demo/app.js"),
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
    moved("/codap/")
}

/// `/codap/` — the page; `/codap/?claim=…` with a claim of a claim's shape (32 hex digits) the
/// page an MCP App's CODAP loads (see [`Framing::App`]). An empty or malformed claim is the
/// normal page, framed by CODAP only.
#[handler]
pub fn plugin_index(request: &poem::Request, Data(state): Data<&State>) -> Response {
    let claimed = request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .filter_map(|pair| pair.strip_prefix("claim="))
            .any(toolrelay_relay::front::is_handle)
    });
    let framing = if claimed {
        Framing::App
    } else {
        Framing::Codap(state)
    };
    serve(PLUGIN, "index.html", framing)
}

/// `/codap/{file}`.
#[handler]
pub fn plugin_file(Path(file): Path<String>, Data(state): Data<&State>) -> Response {
    serve(PLUGIN, &file, Framing::Codap(state))
}

/// `/sdk/{file}`.
#[handler]
pub fn sdk_file(Path(file): Path<String>) -> Response {
    serve(SDK, &file, Framing::Own)
}

/// `/demo` → `/demo/`.
#[handler]
pub fn demo_root() -> Response {
    moved("/demo/")
}

/// `/demo/` — the demo page.
#[handler]
pub fn demo_index() -> Response {
    serve(DEMO, "index.html", Framing::Own)
}

/// `/demo/{file}`.
#[handler]
pub fn demo_file(Path(file): Path<String>) -> Response {
    serve(DEMO, &file, Framing::Own)
}

fn moved(to: &str) -> Response {
    Response::builder()
        .status(StatusCode::MOVED_PERMANENTLY)
        .header(header::LOCATION, to)
        .finish()
}

/// Who may show a page in a frame.
enum Framing<'a> {
    /// CODAP (the configured origins) and the relay itself.
    Codap(&'a State),
    /// Any page: the plugin loaded with a claim, inside the CODAP that an MCP App frames in
    /// a host's sandbox inside the conversation (`frame-ancestors` checks every one of them,
    /// and hosts' sandbox origins are theirs to choose). Such a page pairs only with the
    /// session its claim opened — never with one this browser kept — so a foreign page
    /// framing it overlays nothing of anyone else's.
    App,
    /// The relay itself.
    Own,
}

fn serve(files: &[File], name: &str, framing: Framing) -> Response {
    let Some((_, content_type, body)) = files.iter().find(|(file, _, _)| *file == name) else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .content_type("text/plain; charset=utf-8")
            .body("No such file here.");
    };
    // Only CODAP and the relay may frame the plugin (unless it came for a claim): its buttons
    // end sessions and allow changes, so a foreign page must not overlay them.
    let ancestors = match framing {
        Framing::Codap(state) => std::iter::once("'self'")
            .chain(state.config.cors_origins.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" "),
        Framing::App => "*".to_owned(),
        Framing::Own => "'self'".to_owned(),
    };
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

    /// Where `import … from '<target>'` in a file of `dir` points: a directory and a file.
    fn imported(dir: &'static str, line: &str) -> Option<(&'static str, String)> {
        let target = line.split('\'').nth(1)?;
        let (dir, file) = if let Some(file) = target.strip_prefix("./") {
            (dir, file)
        } else if let Some(file) = target.strip_prefix("../sdk/") {
            ("sdk", file)
        } else {
            ("sdk", target.strip_prefix("/sdk/")?)
        };
        Some((dir, file.to_owned()))
    }

    #[test]
    fn every_module_a_page_imports_is_served() {
        let sets: [(&str, &[File]); 3] = [("plugin", PLUGIN), ("sdk", SDK), ("demo", DEMO)];
        for (dir, files) in sets {
            for (name, _, body) in files {
                for line in body.lines().filter(|line| line.starts_with("import ")) {
                    let (into, file) = imported(dir, line)
                        .unwrap_or_else(|| panic!("{dir}/{name} imports from elsewhere: {line}"));
                    let served = sets
                        .iter()
                        .find(|(set, _)| *set == into)
                        .is_some_and(|(_, files)| files.iter().any(|(f, _, _)| *f == file));
                    assert!(
                        served,
                        "{dir}/{name} imports {into}/{file}, which is not served"
                    );
                }
            }
        }
        assert!(PLUGIN[0].2.contains("main.js") && PLUGIN[0].2.contains("plugin.css"));
        assert!(DEMO[0].2.contains("app.js"));
    }

    #[test]
    fn the_plugins_error_names_are_the_relays() {
        let (_, _, errors) = SDK
            .iter()
            .find(|(name, _, _)| *name == "errors.js")
            .expect("errors.js is served");
        // The lines of `export const ErrorCode = Object.freeze({ … });`.
        let block = errors
            .split_once("export const ErrorCode = Object.freeze({")
            .and_then(|(_, rest)| rest.split_once("});"))
            .expect("errors.js exports ErrorCode")
            .0;
        let listed: Vec<(String, String)> = block
            .lines()
            .filter_map(|line| {
                let (key, value) = line.trim().split_once(": '")?;
                Some((key.to_owned(), value.strip_suffix("',")?.to_owned()))
            })
            .collect();
        let expected: Vec<(String, String)> = toolrelay_relay::front::ErrorCode::ALL
            .iter()
            .map(|code| (code.as_str().to_uppercase(), code.as_str().to_owned()))
            .collect();
        assert_eq!(
            listed, expected,
            "sdk/errors.js must list ErrorCode::ALL, in order"
        );
    }
}
