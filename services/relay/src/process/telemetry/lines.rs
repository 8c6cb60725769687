//! The relay's log lines: tracing-subscriber's own text and JSON lines, with the context of the
//! request being answered ([`RequestContext`]) where a span of its name and fields would be.
//!
//! [`TextLine`] writes the time, the level and the request's context, and leaves the rest of the
//! line (spans, target, fields) to tracing-subscriber's full format. [`JsonLine`] writes the
//! whole object tracing-subscriber's JSON format writes with `flatten_event(true)`: `timestamp`,
//! `level`, the event's fields, `target`, and when there is a span or a request, `span` (the
//! innermost) and `spans` (from the outermost; the request first). A span's fields are its text
//! from [`JsonSpanFields`], copied as they are: tracing-subscriber parses them again for each
//! line. The tests hold both to tracing-subscriber's lines for the same event in a span.

use std::fmt::{self, Display};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_log::NormalizeEvent;
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::time::FormatTime;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::{LookupSpan, SpanRef};

use super::context::RequestContext;
use super::span_fields::{JsonSpanFields, quoted};

/// ANSI styles, as tracing-subscriber paints its text lines on a terminal.
const BOLD: &str = "\x1b[1m";
const DIMMED: &str = "\x1b[2m";
const ITALIC: &str = "\x1b[3m";
const RESET: &str = "\x1b[0m";

/// A text line: tracing-subscriber's full format with the request's context as the outermost
/// span.
#[derive(Debug)]
pub(super) struct TextLine<T> {
    timer: T,
    /// The line after its time and level.
    rest: Format<Full, ()>,
}

impl<T: FormatTime> TextLine<T> {
    pub(super) fn new(timer: T) -> Self {
        Self {
            timer,
            rest: Format::default().without_time().with_level(false),
        }
    }
}

impl<S, N, T> FormatEvent<S, N> for TextLine<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let ansi = writer.has_ansi_escapes();
        let paint = |writer: &mut Writer<'_>, style: &str, text: &dyn Display| {
            if ansi {
                write!(writer, "{style}{text}{RESET}")
            } else {
                write!(writer, "{text}")
            }
        };
        if ansi {
            writer.write_str(DIMMED)?;
        }
        if self.timer.format_time(&mut writer).is_err() {
            writer.write_str("<unknown time>")?;
        }
        if ansi {
            writer.write_str(RESET)?;
        }
        writer.write_char(' ')?;
        let (level, colour) = level_text(*event.metadata().level());
        paint(&mut writer, colour, &level)?;
        writer.write_char(' ')?;
        // As a span: not for an event given its parent (or none) rather than the current span.
        let contextual = event.is_contextual();
        RequestContext::with_current(|request| -> fmt::Result {
            if !contextual {
                return Ok(());
            }
            paint(&mut writer, BOLD, &request.name())?;
            paint(&mut writer, BOLD, &"{")?;
            let mut first = true;
            request.fields(|name, value| {
                if !std::mem::take(&mut first) {
                    writer.write_char(' ')?;
                }
                paint(&mut writer, ITALIC, &name)?;
                paint(&mut writer, DIMMED, &"=")?;
                write!(writer, "{value}")
            })?;
            paint(&mut writer, BOLD, &"}")?;
            paint(&mut writer, DIMMED, &":")?;
            // The spans after it end with the space; with none, it does.
            if ctx.event_scope().is_none() {
                writer.write_char(' ')?;
            }
            Ok(())
        })
        .unwrap_or(Ok(()))?;
        self.rest.format_event(ctx, writer, event)
    }
}

/// A level as a text line shows it, and its colour.
fn level_text(level: Level) -> (&'static str, &'static str) {
    match level {
        Level::TRACE => ("TRACE", "\x1b[35m"),
        Level::DEBUG => ("DEBUG", "\x1b[34m"),
        Level::INFO => (" INFO", "\x1b[32m"),
        Level::WARN => (" WARN", "\x1b[33m"),
        Level::ERROR => ("ERROR", "\x1b[31m"),
    }
}

/// A JSON line, as tracing-subscriber's JSON format with `flatten_event(true)` writes it, with
/// the request's context as the outermost span.
#[derive(Debug)]
pub(super) struct JsonLine<T> {
    timer: T,
}

impl<T: FormatTime> JsonLine<T> {
    pub(super) fn new(timer: T) -> Self {
        Self { timer }
    }
}

impl<S, T> FormatEvent<S, JsonSpanFields> for JsonLine<T>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    T: FormatTime,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonSpanFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let normalized = event.normalized_metadata();
        let meta = normalized.as_ref().unwrap_or_else(|| event.metadata());
        writer.write_str("{\"timestamp\":\"")?;
        self.timer.format_time(&mut writer)?;
        write!(writer, "\",\"level\":\"{}\"", meta.level())?;
        let mut members = Members {
            writer: &mut writer,
            result: Ok(()),
        };
        event.record(&mut members);
        members.result?;
        writer.write_str(",\"target\":")?;
        quoted(&mut writer, format_args!("{}", meta.target()))?;
        // As tracing-subscriber: `span` is the event's parent or else the current span, and
        // `spans` the current span's scope.
        let innermost = event
            .parent()
            .and_then(|id| ctx.span(id))
            .or_else(|| ctx.lookup_current());
        RequestContext::with_current(|request| spans(&mut writer, ctx, &innermost, Some(request)))
            .unwrap_or_else(|| spans(&mut writer, ctx, &innermost, None))?;
        writer.write_str("}\n")
    }
}

/// A JSON line's `span` (the innermost, else the request) and `spans` (the request first, then
/// the current span's scope from the root), when there is a span or a request.
fn spans<S>(
    writer: &mut Writer<'_>,
    ctx: &FmtContext<'_, S, JsonSpanFields>,
    innermost: &Option<SpanRef<'_, S>>,
    request: Option<&RequestContext>,
) -> fmt::Result
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    match (innermost, request) {
        (None, None) => return Ok(()),
        (Some(span), _) => {
            writer.write_str(",\"span\":")?;
            span_object(writer, span)?;
        }
        (None, Some(request)) => {
            writer.write_str(",\"span\":")?;
            context_object(writer, request)?;
        }
    }
    writer.write_str(",\"spans\":[")?;
    let mut first = true;
    if let Some(request) = request {
        context_object(writer, request)?;
        first = false;
    }
    if let Some(current) = ctx.lookup_current() {
        for span in current.scope().from_root() {
            if !std::mem::take(&mut first) {
                writer.write_char(',')?;
            }
            span_object(writer, &span)?;
        }
    }
    writer.write_char(']')
}

/// A span as a JSON line shows it: its fields (kept as a JSON object by [`JsonSpanFields`]) and
/// its `name`.
fn span_object<S>(writer: &mut Writer<'_>, span: &SpanRef<'_, S>) -> fmt::Result
where
    S: for<'a> LookupSpan<'a>,
{
    let extensions = span.extensions();
    let fields = extensions
        .get::<FormattedFields<JsonSpanFields>>()
        .map_or("", |fields| fields.fields.as_str());
    match fields.strip_suffix('}') {
        Some(open) if open != "{" => write!(writer, "{open},\"name\":")?,
        _ => writer.write_str("{\"name\":")?,
    }
    quoted(writer, format_args!("{}", span.metadata().name()))?;
    writer.write_char('}')
}

/// The request's context as a JSON line shows a span.
fn context_object(writer: &mut Writer<'_>, request: &RequestContext) -> fmt::Result {
    writer.write_char('{')?;
    request.fields(|name, value| {
        write!(writer, "\"{name}\":")?;
        quoted(writer, format_args!("{value}"))?;
        writer.write_char(',')
    })?;
    write!(writer, "\"name\":\"{}\"}}", request.name())
}

/// Writes an event's fields as members of the line's object, as tracing-serde's map visitor
/// does: text and `Debug` values as strings, numbers and booleans as they are (a float that is
/// not finite as `null`).
struct Members<'a, 'writer> {
    writer: &'a mut Writer<'writer>,
    result: fmt::Result,
}

impl Members<'_, '_> {
    fn member(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_ok() {
            self.result = self
                .writer
                .write_char(',')
                .and_then(|()| quoted(self.writer, format_args!("{}", field.name())))
                .and_then(|()| self.writer.write_char(':'))
                .and_then(|()| value(self.writer));
        }
    }
}

impl Visit for Members<'_, '_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.member(field, |writer| quoted(writer, format_args!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.member(field, |writer| quoted(writer, format_args!("{value}")));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.member(field, |writer| write!(writer, "{value}"));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.member(field, |writer| write!(writer, "{value}"));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.member(field, |writer| write!(writer, "{value}"));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.member(field, |writer| match serde_json::Number::from_f64(value) {
            Some(number) => write!(writer, "{number}"),
            None => writer.write_str("null"),
        });
    }
}

#[cfg(test)]
mod tests {
    use hyper::http::{Method, Uri};
    use serde_json::Value;

    use super::super::TestLines as Lines;
    use super::*;

    /// A fixed time, so that two formatters' lines can be compared whole.
    #[derive(Clone, Copy)]
    struct Fixed;

    impl FormatTime for Fixed {
        fn format_time(&self, writer: &mut Writer<'_>) -> fmt::Result {
            writer.write_str("2026-12-01T03:30:01.123456Z")
        }
    }

    const PATH: &str = "/api/sessions/ABCD2345/ws";
    const ODD: &str =
        "quote \" backslash \\ newline \n tab \t bell \u{7} backspace \u{8} form feed \u{c} é ∑ 🦀";

    /// The events each test logs, at each level, some inside a span of their own; `request`
    /// says whether they are inside a request's span or a request's context.
    fn log_events(request: bool) {
        let log = || {
            tracing::info!(status = 404, duration_ms = 0_u64, "request refused");
            tracing::warn!(odd = ODD, debug = ?Some("x\"y"), r#type = "raw", "odd {}", 1);
            tracing::error!(below = -7_i64, yes = true, ratio = 0.5_f64, nan = f64::NAN);
            tracing::debug!("debug");
            tracing::trace!("trace");
            tracing::info!(parent: None, "a root event, in no span");
            let inner = tracing::info_span!("inner", count = 3_u64, text = ODD);
            let _inner = inner.enter();
            tracing::info!("in a span");
            let empty = tracing::info_span!("empty");
            let _empty = empty.enter();
            tracing::info!("in two");
        };
        if request {
            let span = tracing::info_span!(
                "request",
                correlation_id = %"corr-1",
                method = %Method::POST,
                path = %super::super::redacted_path(PATH),
            );
            span.in_scope(log);
        } else {
            log();
        }
    }

    /// The same events through tracing-subscriber's own format with a span for the request
    /// (`theirs`), and through ours with the request's context (`ours`).
    fn lines(
        ours: impl Subscriber + Send + Sync,
        theirs: impl Subscriber + Send + Sync,
        request: bool,
    ) {
        tracing::subscriber::with_default(theirs, || log_events(request));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let _logging = tracing::subscriber::set_default(ours);
        if request {
            let context =
                RequestContext::http("corr-1".to_owned(), Method::POST, Uri::from_static(PATH));
            runtime.block_on(context.scope(async { log_events(false) }));
        } else {
            runtime.block_on(async { log_events(false) });
        }
    }

    /// A subscriber with our JSON lines and one with tracing-subscriber's, each with where it
    /// writes them.
    fn json_subscribers() -> (
        (impl Subscriber + Send + Sync, Lines),
        (impl Subscriber + Send + Sync, Lines),
    ) {
        let (ours, theirs) = (Lines::default(), Lines::default());
        let subscriber = || {
            tracing_subscriber::fmt()
                .with_max_level(Level::TRACE)
                .with_ansi(false)
                .fmt_fields(JsonSpanFields)
        };
        let with_ours = subscriber()
            .event_format(JsonLine::new(Fixed))
            .with_writer(ours.clone())
            .finish();
        let with_theirs = subscriber()
            .json()
            .flatten_event(true)
            .with_timer(Fixed)
            .with_writer(theirs.clone())
            .finish();
        ((with_ours, ours), (with_theirs, theirs))
    }

    /// Each JSON line of ours and of theirs, which are the same text, member for member and
    /// byte for byte.
    fn parsed(ours: &Lines, theirs: &Lines) -> Vec<Value> {
        let (ours, theirs) = (ours.text(), theirs.text());
        assert_eq!(ours, theirs);
        ours.lines()
            .map(|line| serde_json::from_str(line).expect(line))
            .collect()
    }

    #[test]
    fn text_lines_are_tracing_subscribers_with_the_request_as_a_span() {
        for ansi in [false, true] {
            for request in [true, false] {
                let (ours, theirs) = (Lines::default(), Lines::default());
                let subscriber = || {
                    tracing_subscriber::fmt()
                        .with_max_level(Level::TRACE)
                        .with_ansi(ansi)
                };
                lines(
                    subscriber()
                        .event_format(TextLine::new(Fixed))
                        .with_writer(ours.clone())
                        .finish(),
                    subscriber()
                        .with_timer(Fixed)
                        .with_writer(theirs.clone())
                        .finish(),
                    request,
                );
                let (ours, theirs) = (ours.text(), theirs.text());
                assert_eq!(ours, theirs, "ansi {ansi}, request {request}");
                assert_eq!(ours.lines().count(), 8);
                if request && !ansi {
                    assert!(ours.contains(
                        " INFO request{correlation_id=corr-1 method=POST \
                         path=/api/sessions/ABCD…/ws}: "
                    ));
                }
            }
        }
    }

    #[test]
    fn json_lines_are_tracing_subscribers_with_the_request_as_a_span() {
        for request in [true, false] {
            let ((with_ours, ours), (with_theirs, theirs)) = json_subscribers();
            lines(with_ours, with_theirs, request);
            let ours = parsed(&ours, &theirs);
            assert_eq!(ours.len(), 8, "request {request}");
            let refused = &ours[0];
            if request {
                assert_eq!(refused["span"]["name"], "request");
                assert_eq!(refused["span"]["correlation_id"], "corr-1");
                assert_eq!(refused["span"]["path"], "/api/sessions/ABCD…/ws");
                assert_eq!(ours[7]["spans"][0]["method"], "POST");
                assert_eq!(ours[7]["span"]["name"], "empty");
                assert_eq!(ours[7]["spans"][1]["text"], ODD);
            } else {
                assert!(refused.get("span").is_none(), "{refused}");
            }
            assert_eq!(refused["status"], 404);
            assert_eq!(ours[1]["odd"], ODD);
            assert!(ours[2]["nan"].is_null());
        }
    }

    /// Records of the `log` crate (tungstenite's, rustls's) are lines with their own target.
    #[test]
    fn log_records_keep_their_target() {
        let record = || {
            let metadata = log::MetadataBuilder::new()
                .target("tungstenite::protocol")
                .level(log::Level::Warn)
                .build();
            tracing_log::format_trace(
                &log::Record::builder()
                    .metadata(metadata)
                    .args(format_args!("a frame"))
                    .module_path(Some("tungstenite::protocol"))
                    .file(Some("protocol.rs"))
                    .line(Some(7))
                    .build(),
            )
            .unwrap();
        };
        let ((with_ours, ours), (with_theirs, theirs)) = json_subscribers();
        tracing::subscriber::with_default(with_ours, record);
        tracing::subscriber::with_default(with_theirs, record);
        let ours = parsed(&ours, &theirs);
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0]["target"], "tungstenite::protocol");
        assert_eq!(ours[0]["level"], "WARN");
    }
}
