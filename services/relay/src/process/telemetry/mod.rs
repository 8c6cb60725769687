//! Logging set-up shared by the binaries: `RUST_LOG` filters (default `info`), `LOG_FORMAT`
//! picks human-readable text or one JSON object per line. Colours only on a terminal.
//!
//! Secrets stay out of the logs: provider tokens travel in headers or `?token=` (never logged),
//! connector handles are cut from logged paths ([`redacted_path`]), and rmcp — which logs whole
//! MCP messages, connector URLs included — is held to warnings unless `RUST_LOG` names it.
//!
//! Lines are written to stdout by a thread of their own, not by the async worker that logged
//! them: a write per finished call on the workers was a tenth of the relay's CPU under load
//! (BENCHMARKS.md). Loggers add their lines to a buffer that the thread writes in one go, at
//! most 50 ms after its first line ([`batched`]): no line wakes a thread of its own. Nothing
//! is dropped: when the writer falls behind, loggers wait for it.

mod batched;
mod context;
mod lines;
mod span_fields;

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime;

pub use batched::LogGuard;
pub use context::RequestContext;

use crate::config::LogFormat;

/// Installs the global subscriber. Call once, at start, and keep what it returns until the
/// end of `main`: dropping it writes out the lines still queued.
#[must_use = "dropping the guard at once stops the log writer"]
pub fn init(format: LogFormat) -> LogGuard {
    let filter = EnvFilter::new(directives(std::env::var("RUST_LOG").ok().as_deref()));
    let (writer, guard) = batched::batched("toolrelay-log", std::io::stdout());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stdout().is_terminal())
            .event_format(lines::TextLine::new(LineTime))
            .try_init(),
        LogFormat::Json => builder
            .with_ansi(false)
            .fmt_fields(span_fields::JsonSpanFields)
            .event_format(lines::JsonLine::new(LineTime))
            .try_init(),
    };
    if let Err(error) = installed {
        eprintln!("logging was already set up: {error}");
    }
    guard
}

/// When a line was logged, as tracing-subscriber's own `SystemTime` writes it (RFC 3339, UTC,
/// to the microsecond), but in one piece: its own writes a field at a time, and the text a JSON
/// line keeps it in grew three times for each line.
#[derive(Debug, Clone, Copy, Default)]
struct LineTime;

impl FormatTime for LineTime {
    fn format_time(&self, writer: &mut Writer<'_>) -> std::fmt::Result {
        let now = humantime::format_rfc3339_micros(std::time::SystemTime::now());
        write!(writer, "{now}")
    }
}

/// The filter directives for a `RUST_LOG` value: `info` by default, and rmcp at `warn` unless
/// the value names it (its request lines carry whole messages and URLs).
fn directives(rust_log: Option<&str>) -> String {
    let base = rust_log.map(str::trim).filter(|value| !value.is_empty());
    match base {
        Some(value) if value.contains("rmcp") => value.to_owned(),
        Some(value) => format!("{value},rmcp=warn"),
        None => "info,rmcp=warn".to_owned(),
    }
}

/// A request path fit for the logs: the secret handle of a connector URL (`/mcp/s/{handle}`)
/// is replaced with `…`, and a pairing code (`/api/sessions/{code}`) is cut to its prefix
/// (`ABCD…`).
pub fn redacted_path(path: &str) -> RedactedPath<'_> {
    RedactedPath(path)
}

/// A request path as a log shows it ([`redacted_path`]): written out where it is logged,
/// with no string built for a request whose line is never written.
#[derive(Debug, Clone, Copy)]
pub struct RedactedPath<'a>(&'a str);

impl std::fmt::Display for RedactedPath<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self.0;
        let (prefix, rest) = if let Some(rest) = path.strip_prefix("/mcp/s/") {
            ("/mcp/s/", rest)
        } else if let Some(rest) = path.strip_prefix("/api/sessions/") {
            ("/api/sessions/", rest)
        } else {
            return f.write_str(path);
        };
        let end = rest.find('/').unwrap_or(rest.len());
        let (secret, tail) = rest.split_at(end);
        f.write_str(prefix)?;
        if prefix == "/mcp/s/" {
            f.write_str("…")?;
        } else {
            // As `code::redacted`: the first four letters or digits.
            for c in secret.chars().filter(char::is_ascii_alphanumeric).take(4) {
                std::fmt::Write::write_char(f, c)?;
            }
            f.write_str("…")?;
        }
        f.write_str(tail)
    }
}

#[cfg(test)]
use testing::TestLines;

/// What the formatters' tests share.
#[cfg(test)]
mod testing {
    use std::sync::{Arc, Mutex};

    /// Where a test's subscriber writes its lines.
    #[derive(Clone, Default)]
    pub(super) struct TestLines(Arc<Mutex<Vec<u8>>>);

    impl TestLines {
        /// The text written so far, taken.
        pub(super) fn text(&self) -> String {
            String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
        }
    }

    impl std::io::Write for TestLines {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for TestLines {
        type Writer = Self;
        fn make_writer(&'a self) -> Self {
            self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the pieces a timestamp is written in, and keeps the text.
    #[derive(Default)]
    struct Pieces(usize, String);

    impl std::fmt::Write for Pieces {
        fn write_str(&mut self, text: &str) -> std::fmt::Result {
            self.0 += 1;
            self.1.push_str(text);
            Ok(())
        }
    }

    #[test]
    fn a_line_is_timed_as_tracing_subscriber_times_it_in_one_piece() {
        let (mut ours, mut theirs) = (Pieces::default(), Pieces::default());
        LineTime.format_time(&mut Writer::new(&mut ours)).unwrap();
        tracing_subscriber::fmt::time::SystemTime
            .format_time(&mut Writer::new(&mut theirs))
            .unwrap();
        assert_eq!(ours.0, 1, "written in one piece: {:?}", ours.1);
        assert!(theirs.0 > 1, "tracing's own is written in pieces");
        // The same form: RFC 3339 in UTC, to the microsecond ("2026-11-30T15:01:02.123456Z").
        assert_eq!(
            ours.1.len(),
            theirs.1.len(),
            "{} against {}",
            ours.1,
            theirs.1
        );
        assert_eq!(ours.1.as_bytes()[19], b'.');
        assert!(ours.1.ends_with('Z'));
        let ours = humantime::parse_rfc3339(&ours.1).unwrap();
        let theirs = humantime::parse_rfc3339(&theirs.1).unwrap();
        let apart = theirs
            .duration_since(ours)
            .or_else(|_| ours.duration_since(theirs))
            .unwrap();
        assert!(
            apart < std::time::Duration::from_secs(60),
            "{apart:?} apart"
        );
    }

    #[test]
    fn rmcp_is_quiet_unless_asked_for() {
        assert_eq!(directives(None), "info,rmcp=warn");
        assert_eq!(directives(Some("debug")), "debug,rmcp=warn");
        assert_eq!(directives(Some("info,rmcp=debug")), "info,rmcp=debug");
    }

    #[test]
    fn connector_handles_and_codes_are_cut_from_paths() {
        assert_eq!(redacted_path("/mcp/s/0123abcd").to_string(), "/mcp/s/…");
        assert_eq!(redacted_path("/mcp/s/0123abcd/x").to_string(), "/mcp/s/…/x");
        assert_eq!(
            redacted_path("/api/sessions/ABCD2345/ws").to_string(),
            "/api/sessions/ABCD…/ws"
        );
        assert_eq!(
            redacted_path("/api/sessions/abcd-2345").to_string(),
            "/api/sessions/abcd…"
        );
        assert_eq!(redacted_path("/api/sessions").to_string(), "/api/sessions");
        assert_eq!(redacted_path("/healthz").to_string(), "/healthz");
    }
}
