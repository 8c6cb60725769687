//! A span's fields as the JSON log lines carry them, written straight as a JSON object.
//!
//! tracing-subscriber's JSON formatter keeps each span's fields as JSON text, made when the span
//! begins: its `JsonFields` first collects them in a map of `serde_json::Value`s, each value a
//! `String` formatted apart, then writes the map out. [`JsonSpanFields`] writes the same object
//! without them, and a JSON line ([`super::lines::JsonLine`]) copies it as it is. (A request's
//! own context is no span: [`super::RequestContext`].)

use std::cell::RefCell;
use std::fmt::{self, Write};

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::FormattedFields;
use tracing_subscriber::fmt::format::Writer;

/// A span's fields as one JSON object, each value as `JsonFields` gives it: text and
/// `Debug`/`Display` values as strings, numbers and booleans as they are (a float that is not
/// finite as `null`); fields named `log.*` left out, a raw identifier's `r#` dropped.
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonSpanFields;

thread_local! {
    /// Where a thread writes a span's object before it is copied out whole: the span's own
    /// text is then one allocation of the right size, not one for each time it grew.
    static SCRATCH: RefCell<String> = const { RefCell::new(String::new()) };
}

/// Past this, a thread's scratch text is let go rather than kept for the next span.
const SCRATCH_KEPT: usize = 4 * 1024;

impl<'writer> FormatFields<'writer> for JsonSpanFields {
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        SCRATCH.with(|scratch| {
            // A value whose `Debug` begins a span of its own writes straight to its writer.
            let Ok(mut scratch) = scratch.try_borrow_mut() else {
                return write_object(&mut writer, fields);
            };
            scratch.clear();
            let written = write_object(&mut Writer::new(&mut *scratch), fields)
                .and_then(|()| writer.write_str(&scratch));
            if scratch.capacity() > SCRATCH_KEPT {
                *scratch = String::new();
            }
            written
        })
    }

    fn add_fields(
        &self,
        current: &'writer mut FormattedFields<Self>,
        fields: &tracing::span::Record<'_>,
    ) -> fmt::Result {
        if current.fields.is_empty() || current.fields == "{}" {
            current.fields.clear();
            return self.format_fields(current.as_writer(), fields);
        }
        // Fields recorded after the span began (seldom): the object is read, added to and
        // written again, so that a field recorded twice is there once.
        let mut added = String::new();
        self.format_fields(Writer::new(&mut added), fields)?;
        let mut merged: Map<String, Value> =
            serde_json::from_str(&current.fields).map_err(|_| fmt::Error)?;
        let added: Map<String, Value> = serde_json::from_str(&added).map_err(|_| fmt::Error)?;
        merged.extend(added);
        current.fields = Value::Object(merged).to_string();
        Ok(())
    }
}

/// Writes `fields` as one JSON object.
fn write_object(writer: &mut Writer<'_>, fields: impl RecordFields) -> fmt::Result {
    let mut object = Object {
        writer,
        empty: true,
        result: Ok(()),
    };
    fields.record(&mut object);
    let Object {
        writer,
        empty,
        result,
    } = object;
    result?;
    writer.write_str(if empty { "{}" } else { "}" })
}

/// Writes fields as the members of one JSON object, opening it at the first.
struct Object<'a, 'writer> {
    writer: &'a mut Writer<'writer>,
    empty: bool,
    result: fmt::Result,
}

impl Object<'_, '_> {
    /// Writes the member's name (and what comes before it); false for a field left out.
    fn name(&mut self, field: &Field) -> bool {
        let name = field.name();
        if self.result.is_err() || name.starts_with("log.") {
            return false;
        }
        let name = name.strip_prefix("r#").unwrap_or(name);
        let opening = if self.empty { "{" } else { "," };
        self.empty = false;
        self.result = self
            .writer
            .write_str(opening)
            .and_then(|()| quoted(self.writer, format_args!("{name}")))
            .and_then(|()| self.writer.write_char(':'));
        self.result.is_ok()
    }

    fn value(&mut self, value: fmt::Arguments<'_>) {
        if self.result.is_ok() {
            self.result = self.writer.write_fmt(value);
        }
    }
}

impl Visit for Object<'_, '_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if self.name(field) {
            self.result = quoted(self.writer, format_args!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if self.name(field) {
            self.result = quoted(self.writer, format_args!("{value}"));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if self.name(field) {
            self.value(format_args!("{value}"));
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if self.name(field) {
            self.value(format_args!("{value}"));
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        if self.name(field) {
            self.value(format_args!("{value}"));
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        if self.name(field) {
            // As serde_json writes an f64 `Value` (a float that is not finite is `null`).
            match serde_json::Number::from_f64(value) {
                Some(number) => self.value(format_args!("{number}")),
                None => self.value(format_args!("null")),
            }
        }
    }
}

/// Writes `text` as a JSON string, escaped as it is formatted.
pub(super) fn quoted(writer: &mut Writer<'_>, text: fmt::Arguments<'_>) -> fmt::Result {
    writer.write_char('"')?;
    Escaping(writer).write_fmt(text)?;
    writer.write_char('"')
}

/// Escapes what is written through it for a JSON string, as serde_json does.
struct Escaping<'a, 'writer>(&'a mut Writer<'writer>);

impl Write for Escaping<'_, '_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        // Byte by byte: each byte escaped is ASCII, so it is a character of its own and the
        // text either side of it is whole characters.
        let mut plain = 0;
        for (at, &byte) in text.as_bytes().iter().enumerate() {
            let escape = match byte {
                b'"' => "\\\"",
                b'\\' => "\\\\",
                b'\n' => "\\n",
                b'\r' => "\\r",
                b'\t' => "\\t",
                0x08 => "\\b",
                0x0c => "\\f",
                byte if byte < b' ' => "",
                _ => continue,
            };
            self.0.write_str(&text[plain..at])?;
            if escape.is_empty() {
                write!(self.0, "\\u{byte:04x}")?;
            } else {
                self.0.write_str(escape)?;
            }
            plain = at + 1;
        }
        self.0.write_str(&text[plain..])
    }
}

#[cfg(test)]
mod tests {
    use super::super::TestLines as Lines;
    use super::*;

    /// The spans of the line an event inside nested spans logs (with fields recorded after a
    /// span began), as JSON.
    fn logged(subscriber: impl tracing::Subscriber + Send + Sync, lines: &Lines) -> Value {
        tracing::subscriber::with_default(subscriber, || {
            let text = "quote \" backslash \\ newline \n tab \t bell \u{7} é ∑ 🦀";
            let outer = tracing::info_span!(
                "request",
                correlation_id = %"corr-1",
                method = %"POST",
                path = text,
                debug = ?Some("x\"y"),
                r#type = "raw",
                count = 42_u64,
                below = -7_i64,
                yes = true,
                ratio = 0.5_f64,
                nan = f64::NAN,
                later = tracing::field::Empty,
            );
            let _outer = outer.enter();
            outer.record("later", "recorded");
            outer.record("count", 43_u64);
            let inner = tracing::info_span!("inner");
            let _inner = inner.enter();
            tracing::info!(status = 200, "line");
        });
        let line: Value = serde_json::from_str(&lines.text()).unwrap();
        serde_json::json!({"span": line["span"], "spans": line["spans"]})
    }

    #[test]
    fn span_fields_are_logged_as_tracing_subscribers_json_logs_them() {
        let (ours, theirs) = (Lines::default(), Lines::default());
        let with_ours = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .fmt_fields(JsonSpanFields)
            .with_writer(ours.clone())
            .finish();
        let with_theirs = tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_writer(theirs.clone())
            .finish();
        let (ours, theirs) = (logged(with_ours, &ours), logged(with_theirs, &theirs));
        assert_eq!(ours, theirs);
        let request = &ours["spans"][0];
        assert_eq!(request["correlation_id"], "corr-1");
        assert_eq!(request["count"], 43);
        assert_eq!(request["later"], "recorded");
        assert_eq!(request["type"], "raw");
        assert!(request["nan"].is_null());
        assert_eq!(ours["span"]["name"], "inner");
    }
}
