//! Conversions between JSON (`serde_json::Value`) and the protobuf well-known types that carry
//! JSON over gRPC (`google.protobuf.Struct` and `Value`).
//!
//! Reading JSON text goes through [`from_slice`] / [`from_str`], which tell JSON nested past
//! the parser's own limit ([`ReadError::TooDeep`]) from JSON that is otherwise malformed.
//!
//! Protobuf numbers are doubles. Integral doubles that fit in JavaScript's safe range come
//! back as JSON integers, so `{"age": 36}` survives a round trip as `36`, not `36.0`.

use prost_types::{ListValue, Struct, Value as PbValue, value::Kind};
use serde::de::DeserializeOwned;
use serde_json::{Map, Number, Value};

/// Largest integer a double holds exactly (2^53 - 1), as JavaScript's `Number.MAX_SAFE_INTEGER`.
const MAX_SAFE_INTEGER: f64 = 9_007_199_254_740_991.0;

/// A JSON object as a protobuf `Struct`; a value that is not an object gives an empty struct.
pub fn to_struct(value: &Value) -> Struct {
    match value {
        Value::Object(map) => object_to_struct(map),
        _ => Struct::default(),
    }
}

/// A protobuf `Struct` as a JSON object.
pub fn from_struct(value: &Struct) -> Value {
    Value::Object(
        value
            .fields
            .iter()
            .map(|(key, field)| (key.clone(), from_value(field)))
            .collect(),
    )
}

/// Any JSON value as a protobuf `Value`.
pub fn to_value(value: &Value) -> PbValue {
    let kind = match value {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(to_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(object_to_struct(map)),
    };
    PbValue { kind: Some(kind) }
}

/// A protobuf `Value` as JSON; a `Value` with no kind set, or a non-finite number, is `null`.
pub fn from_value(value: &PbValue) -> Value {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::NumberValue(n)) => number(*n),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::ListValue(list)) => Value::Array(list.values.iter().map(from_value).collect()),
        Some(Kind::StructValue(s)) => from_struct(s),
    }
}

/// `value` as JSON text in a `String` of its own length: written into a buffer each thread
/// keeps, then copied out, so the text is one allocation. (`serde_json::to_string` grows its
/// text as it writes, and a text with room to spare costs an allocation more again where it
/// becomes a message or a response body, which share it only when it has none.)
pub fn to_string_sized<T: serde::Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    /// Past this, a thread's buffer is let go rather than kept for the next text.
    const KEPT: usize = 64 * 1024;
    thread_local! {
        static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    SCRATCH.with(|scratch| {
        // A `Serialize` that writes JSON of its own while it is written gets a buffer apart.
        let Ok(mut scratch) = scratch.try_borrow_mut() else {
            return serde_json::to_string(value);
        };
        scratch.clear();
        let written = serde_json::to_writer(&mut *scratch, value).map(|()| {
            // serde_json writes UTF-8 only.
            String::from_utf8_lossy(&scratch).into_owned()
        });
        if scratch.capacity() > KEPT {
            *scratch = Vec::new();
        }
        written
    })
}

/// How deeply `value` nests objects and arrays: 0 for a scalar, 1 for `{}` or `[1, 2]`, 2 for
/// `{"a": [1]}`. Iterative, so any value can be measured; allocates only for a container
/// within a container.
pub fn depth(value: &Value) -> usize {
    let mut deepest = 0;
    walk_containers(value, 1, |_, level| {
        deepest = deepest.max(level);
        level + 1
    });
    deepest
}

/// How many JSON values `value` holds, itself included: what checking it against a schema
/// walks through.
pub fn values(value: &Value) -> usize {
    let mut count = 1;
    walk_containers(value, (), |container, ()| {
        count += children(container).count();
    });
    count
}

/// About how many bytes `value` takes as JSON (escapes aside): what a store counts it as.
/// Iterative, and cheaper than serialising it.
pub fn approx_size(value: &Value) -> usize {
    let scalar = |value: &Value| match value {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(_) => 8,
        Value::String(text) => text.len() + 2,
        Value::Array(_) | Value::Object(_) => 0,
    };
    let mut size = scalar(value);
    walk_containers(value, (), |container, ()| {
        size += match container {
            Value::Object(map) => 2 + map.keys().map(|key| key.len() + 4).sum::<usize>(),
            Value::Array(items) => 2 + items.len(),
            _ => 0,
        };
        size += children(container).map(scalar).sum::<usize>();
    });
    size
}

/// How many bytes `value` takes as compact JSON (`usize::MAX` if it cannot be written as
/// JSON), counted as it is written out, without keeping the text.
pub fn encoded_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    match serde_json::to_writer(&mut counter, value) {
        Ok(()) => counter.0,
        Err(_) => usize::MAX,
    }
}

/// Calls `visit` on every array and object within `value` (itself included), with what
/// `visit` gave its parent (`first` for `value`); scalars are the visitor's to read among a
/// container's [`children`]. Iterative: the stack holds the containers still to visit, and
/// allocates only when a container holds one.
fn walk_containers<T: Copy>(value: &Value, first: T, mut visit: impl FnMut(&Value, T) -> T) {
    let is_container = |value: &&Value| matches!(value, Value::Array(_) | Value::Object(_));
    let mut stack = Vec::new();
    let mut next = Some((value, first)).filter(|(value, _)| is_container(value));
    while let Some((container, given)) = next.take().or_else(|| stack.pop()) {
        let passed = visit(container, given);
        stack.extend(
            children(container)
                .filter(is_container)
                .map(|child| (child, passed)),
        );
    }
}

/// The values directly within an array or object (none for a scalar).
fn children(value: &Value) -> impl Iterator<Item = &Value> {
    let (items, fields) = match value {
        Value::Array(items) => (items.as_slice(), None),
        Value::Object(map) => (&[][..], Some(map.values())),
        _ => (&[][..], None),
    };
    items.iter().chain(fields.into_iter().flatten())
}

fn object_to_struct(map: &Map<String, Value>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(key, field)| (key.clone(), to_value(field)))
            .collect(),
    }
}

fn number(n: f64) -> Value {
    if n.fract() == 0.0 && n.abs() <= MAX_SAFE_INTEGER {
        // The range check above makes the cast exact.
        Value::Number(Number::from(n as i64))
    } else {
        Number::from_f64(n).map_or(Value::Null, Value::Number)
    }
}

/// Levels of arrays and objects serde_json refuses to read (its recursion limit): text that
/// reaches this many is [`ReadError::TooDeep`].
pub const PARSER_DEPTH_LIMIT: usize = 128;

/// Why JSON text could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The text reaches [`PARSER_DEPTH_LIMIT`] levels of nesting where the parser stopped.
    TooDeep(serde_json::Error),
    /// It is malformed, or not of the expected shape.
    Invalid(serde_json::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TooDeep(error) | Self::Invalid(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for ReadError {}

/// Reads JSON text as a `T`.
pub fn from_slice<T: DeserializeOwned>(text: &[u8]) -> Result<T, ReadError> {
    serde_json::from_slice(text).map_err(|error| read_error(text, error))
}

/// Reads JSON text as a `T`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, ReadError> {
    from_slice(text.as_bytes())
}

/// Why `text` is not JSON, if it is not: what [`from_slice`] answers for a `Value` (which,
/// unlike `IgnoredAny`, the parser reads to its depth limit).
pub fn check(text: &[u8]) -> Result<(), ReadError> {
    from_slice::<Value>(text).map(drop)
}

/// The parser's error, told apart by how deeply the text nests up to where the parser stopped
/// (its line and 1-based column, the character it stopped at included).
fn read_error(text: &[u8], error: serde_json::Error) -> ReadError {
    if !error.is_syntax() {
        return ReadError::Invalid(error);
    }
    let line_start = match error.line() {
        0 | 1 => 0,
        line => text
            .iter()
            .enumerate()
            .filter(|(_, byte)| **byte == b'\n')
            .nth(line - 2)
            .map_or(text.len(), |(at, _)| at + 1),
    };
    let end = (line_start + error.column()).min(text.len());
    if nesting(&text[..end]) >= PARSER_DEPTH_LIMIT {
        ReadError::TooDeep(error)
    } else {
        ReadError::Invalid(error)
    }
}

/// The deepest nesting of arrays and objects in (a prefix of) JSON text, brackets inside
/// strings aside.
fn nesting(text: &[u8]) -> usize {
    let (mut level, mut deepest) = (0usize, 0);
    let (mut in_string, mut escaped) = (false, false);
    for &byte in text {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if in_string => escaped = true,
            b'"' => in_string = !in_string,
            _ if in_string => {}
            b'[' | b'{' => {
                level += 1;
                deepest = deepest.max(level);
            }
            b']' | b'}' => level = level.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sized_text_is_serde_jsons_own_at_its_length() {
        /// Writes, while it is written, a text of its own through the same buffer.
        struct Nested(Value);
        impl serde::Serialize for Nested {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let inner = to_string_sized(&self.0).map_err(serde::ser::Error::custom)?;
                serializer.serialize_str(&inner)
            }
        }
        let big = "x".repeat(100 * 1024);
        for value in [
            json!({"type": "tool_request", "request_id": "r1", "args": {"é": "\"quoted\"\n"}}),
            json!([1, 2.5, null, true, {}]),
            json!({ "big": big }),
            json!("after a big one"),
        ] {
            let sized = to_string_sized(&value).unwrap();
            assert_eq!(sized, serde_json::to_string(&value).unwrap());
            assert_eq!(sized.capacity(), sized.len(), "no room to spare");
        }
        let nested = to_string_sized(&Nested(json!({"a": [1]}))).unwrap();
        assert_eq!(nested, r#""{\"a\":[1]}""#);
        // A map whose keys are not strings cannot be written: the error, as serde_json's.
        let refused = std::collections::HashMap::from([((1, 2), 3)]);
        assert!(to_string_sized(&refused).is_err());
        assert_eq!(to_string_sized(&1).unwrap(), "1");
    }

    #[test]
    fn objects_round_trip_through_struct() {
        let original = json!({
            "name": "Ada", "age": 36, "height": 1.62, "negative": -4,
            "tags": ["a", "b"], "nested": {"ok": true, "none": null}
        });
        assert_eq!(from_struct(&to_struct(&original)), original);
    }

    #[test]
    fn any_value_round_trips_through_value() {
        for original in [
            json!(null),
            json!(1.5),
            json!("text"),
            json!([1, "two", {"three": 3}]),
        ] {
            assert_eq!(from_value(&to_value(&original)), original);
        }
    }

    #[test]
    fn non_objects_become_empty_structs() {
        assert_eq!(from_struct(&to_struct(&json!([1, 2]))), json!({}));
    }

    #[test]
    fn depth_counts_nested_containers() {
        assert_eq!(depth(&json!(3)), 0);
        assert_eq!(depth(&json!({})), 1);
        assert_eq!(depth(&json!([1, 2])), 1);
        assert_eq!(depth(&json!({"a": [1, {"b": null}], "c": 2})), 3);
        let mut deep = json!(1);
        for _ in 0..1000 {
            deep = json!([deep]);
        }
        assert_eq!(depth(&deep), 1000);
    }

    #[test]
    fn values_and_sizes_count_every_value_once() {
        let value = json!({"name": "Ada", "tags": ["a", "b", []], "n": {"m": null}});
        // The object, its three fields, the array's three items, the inner object's one.
        assert_eq!(values(&value), 8);
        assert_eq!(values(&json!(3)), 1);
        assert_eq!(values(&json!([])), 1);
        // The object 2 + 3 × 4 + 9 for its keys; "Ada" 5; the array 2 + 3, "a" and "b" 3
        // each, [] 2; the inner object 2 + 5, null 5.
        assert_eq!(approx_size(&value), 23 + 5 + 5 + 6 + 2 + 7 + 5);
        assert_eq!(approx_size(&json!("abc")), 5);
        assert_eq!(approx_size(&json!(null)), 5);
    }

    #[test]
    fn the_encoded_length_is_the_texts() {
        for value in [
            json!(null),
            json!({"name": "Ada", "tags": ["a", "b"], "quote": "\"é\"\n"}),
            json!("x".repeat(10_000)),
        ] {
            assert_eq!(encoded_len(&value), value.to_string().len());
        }
    }

    #[test]
    fn approximate_sizes_are_close_to_the_json() {
        for value in [
            json!({"name": "Ada", "tags": ["a", "b"], "n": 12345, "ok": true}),
            json!({"rows": (0..100).map(|i| json!({"x": i, "label": format!("row {i}")})).collect::<Vec<_>>()}),
            json!("x".repeat(10_000)),
        ] {
            let exact = value.to_string().len() as f64;
            let approx = approx_size(&value) as f64;
            assert!((approx / exact - 1.0).abs() < 0.35, "{approx} for {exact}");
        }
    }

    #[test]
    fn integers_beyond_the_safe_range_stay_doubles() {
        assert_eq!(from_value(&to_value(&json!(1e300))), json!(1e300));
        assert_eq!(
            from_value(&PbValue {
                kind: Some(Kind::NumberValue(f64::NAN))
            }),
            json!(null)
        );
    }

    #[test]
    fn text_nested_past_the_parser_is_told_from_malformed_text() {
        let deep = |levels: usize| "[".repeat(levels) + &"]".repeat(levels);
        assert!(from_str::<Value>(&deep(PARSER_DEPTH_LIMIT - 1)).is_ok());
        for levels in [PARSER_DEPTH_LIMIT, 300] {
            assert!(matches!(
                from_str::<Value>(&deep(levels)),
                Err(ReadError::TooDeep(_))
            ));
            assert!(matches!(
                check(deep(levels).as_bytes()),
                Err(ReadError::TooDeep(_))
            ));
        }
        // On a later line, and inside an object whose strings hold brackets.
        let text = format!("{{\n \"a\": \"[[{{\\\"\",\n \"b\": {}}}", deep(200));
        assert!(matches!(
            from_str::<Value>(&text),
            Err(ReadError::TooDeep(_))
        ));
        // Malformed before it gets that deep, or malformed only.
        let text = format!("[1, x, {}]", deep(200));
        assert!(matches!(
            from_str::<Value>(&text),
            Err(ReadError::Invalid(_))
        ));
        let text = format!("{}x{}", "[".repeat(PARSER_DEPTH_LIMIT - 1), "]".repeat(127));
        assert!(matches!(
            from_str::<Value>(&text),
            Err(ReadError::Invalid(_))
        ));
        assert!(matches!(
            from_str::<Value>("{\"a\": }"),
            Err(ReadError::Invalid(_))
        ));
        // Well-formed JSON of the wrong shape is not "too deep".
        assert!(matches!(
            from_str::<Vec<u8>>("{}"),
            Err(ReadError::Invalid(_))
        ));
    }
}
