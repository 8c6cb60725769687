//! How the Redis store writes a call and reads back calls and sessions. A session is the values
//! of `SESSION_FIELDS` in order. A call is kept in its session's hash under `r:<id>` as one line
//! of its state and names, then its payload:
//!
//! ```text
//! <seq> <status> <delivered to> <deliveries> <lease> <created> <deadline> <finished> <flags>
//!   <hash> <correlation id> <tool> <function> <caller>\n<payload>
//! ```
//!
//! (one line, each token separated by one space): the status one letter ([`letter`]); the
//! lease, deadline and finished times in ms after `created` ('' for none); flags 1 for a
//! built-in call, 2 for an evicted answer; the hash ([`crate::store::call_hash`]) in base64url;
//! names with `%`, space and newline escaped. The payload is the arguments' JSON while the call
//! runs and its answer ([`stored_answer`]) once it is finished. The scripts read the state by
//! one pattern match and never parse the names or the payload (`lua/library.lua`,
//! `lua/flat_*.lua`). A call leaves a script as a message, `<id> <stored form>` ([`pack`]).
//!
//! Calls written by a relay before this layout (each of 17 or 18 fields as `<length>:<value>`,
//! the id first) still read ([`older`]); this version writes none.

use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolError, ToolResponse};

use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::store::{CALL_HASH_BYTES, ProviderInfo, RequestRecord, SessionRecord, Transport};

/// The tokens of a stored call's first line.
const TOKENS: usize = 14;

/// A session's fields, in the order the scripts answer them (`SESSION_FIELDS` in
/// `lua/library.lua`).
#[derive(Clone, Copy)]
#[repr(usize)]
enum SessionField {
    Code,
    TokenHash,
    CreatedAt,
    ExpiresAt,
    MaxExpiresAt,
    _KeysUntil,
    McpHandle,
    _Manifest,
    ManifestRevision,
    _NextSeq,
    _Pending,
    _Finished,
    _AnswerBytes,
    _KeptFrom,
    _OldestAt,
    ProviderConnection,
    ProviderTransport,
    ProviderConnectedAt,
    ProviderLastSeen,
}

/// A call as it leaves a script or a replica: `<id> <stored form>`.
pub(super) fn pack(record: &RequestRecord) -> String {
    format!("{} {}", record.id, stored(record))
}

/// A call as its session's hash keeps it.
pub(super) fn stored(record: &RequestRecord) -> String {
    let [state, rest] = pieces(record);
    format!("{} {state} {rest}", record.seq)
}

/// The lease token of a call handed to its tab when queued: leased until its deadline.
pub(super) fn handed_lease(record: &RequestRecord) -> String {
    since(record.created_at, Some(record.deadline))
}

/// A call in the pieces `lua/flat_enqueue.lua` joins after its place in the queue (and
/// [`stored`] after its `seq`):
/// `[state, rest]` — status, delivered to, deliveries and lease as made here (the script writes
/// its own for a call it hands to the tab); then the rest of the line and the payload.
pub(super) fn pieces(record: &RequestRecord) -> [String; 2] {
    let created = record.created_at;
    let state = format!(
        "{} {} {} {}",
        letter(record.status),
        escaped(record.delivered_to.as_deref().unwrap_or_default()),
        record.deliveries,
        since(created, record.lease_until),
    );
    let flags = u8::from(record.builtin) | (u8::from(record.evicted) << 1);
    let payload = match (&record.finished_at, &record.response) {
        (Some(_), Some(response)) => stored_answer(response).unwrap_or_default(),
        (Some(_), None) => String::new(),
        (None, _) if record.args.is_null() => String::new(),
        (None, _) => record.args.to_string(),
    };
    let rest = format!(
        "{} {} {} {flags} {} {} {} {} {}\n{payload}",
        created.0,
        since(created, Some(record.deadline)),
        since(created, record.finished_at),
        stored_hash(&record.call_hash),
        escaped(record.correlation_id.as_deref().unwrap_or_default()),
        escaped(record.tool_id.as_deref().unwrap_or_default()),
        escaped(&record.function_name),
        escaped(record.caller.as_deref().unwrap_or_default()),
    );
    [state, rest]
}

/// A status as a stored call keeps it (`STATUS_OF` in `lua/library.lua`).
fn letter(status: RequestStatus) -> char {
    match status {
        RequestStatus::Queued => 'q',
        RequestStatus::Delivered => 'd',
        RequestStatus::Completed => 'c',
        RequestStatus::Failed => 'f',
        RequestStatus::Expired => 'x',
        RequestStatus::Cancelled => 'n',
        RequestStatus::AwaitingApproval => 'a',
    }
}

fn status_of_letter(letter: &str) -> Result<RequestStatus, StoreError> {
    Ok(match letter {
        "q" => RequestStatus::Queued,
        "d" => RequestStatus::Delivered,
        "c" => RequestStatus::Completed,
        "f" => RequestStatus::Failed,
        "x" => RequestStatus::Expired,
        "n" => RequestStatus::Cancelled,
        "a" => RequestStatus::AwaitingApproval,
        _ => return Err(corrupt("status")),
    })
}

/// A time as ms after `created` ('' for none).
fn since(created: Timestamp, at: Option<Timestamp>) -> String {
    at.map(|at| (at.0 - created.0).to_string())
        .unwrap_or_default()
}

/// A name with the three characters that would break its line escaped (`%`, space, newline).
fn escaped(name: &str) -> std::borrow::Cow<'_, str> {
    if !name.contains(['%', ' ', '\n']) {
        return name.into();
    }
    name.replace('%', "%25")
        .replace(' ', "%20")
        .replace('\n', "%0A")
        .into()
}

fn unescaped(token: &str) -> String {
    if !token.contains('%') {
        return token.to_owned();
    }
    token
        .replace("%20", " ")
        .replace("%0A", "\n")
        .replace("%25", "%")
}

/// A call's hash (hex) as kept: base64url (22 characters for its 16 bytes, not 32).
fn stored_hash(hex: &str) -> String {
    let mut bytes = [0; CALL_HASH_BYTES];
    match data_encoding::HEXLOWER.decode_mut(hex.as_bytes(), &mut bytes) {
        Ok(_) => data_encoding::BASE64URL_NOPAD.encode(&bytes),
        // Not one this crate made (none is): kept as it came.
        Err(_) => escaped(hex).into_owned(),
    }
}

/// A kept hash as hex: the whole of one kept in base64url, the first 16 bytes of an older
/// relay's (64 hex digits).
fn hash_of(token: &str) -> String {
    let mut bytes = [0; CALL_HASH_BYTES];
    if token.len() == 22
        && data_encoding::BASE64URL_NOPAD
            .decode_mut(token.as_bytes(), &mut bytes)
            .is_ok()
    {
        return data_encoding::HEXLOWER.encode(&bytes);
    }
    token
        .get(..2 * CALL_HASH_BYTES)
        .filter(|_| token.len() == 4 * CALL_HASH_BYTES)
        .unwrap_or(token)
        .to_owned()
}

fn corrupt(what: &str) -> StoreError {
    StoreError(format!("a stored call's {what} is unreadable"))
}

fn optional(field: &str) -> Option<String> {
    (!field.is_empty()).then(|| field.to_owned())
}

fn time(field: &str) -> Option<Timestamp> {
    field.parse().ok().map(Timestamp)
}

/// A call that left a script or a replica (`<id> <stored form>`, or an older relay's call
/// whole), read back.
pub(super) fn unpack(message: &str) -> Result<RequestRecord, StoreError> {
    match message.split_once(' ') {
        Some((id, stored)) => match read(id, stored) {
            Ok(record) => Ok(record),
            Err(_) if is_older(message) => older(message),
            Err(error) => Err(error),
        },
        None => older(message),
    }
}

/// Call `id` read from its stored form.
pub(super) fn read(id: &str, stored: &str) -> Result<RequestRecord, StoreError> {
    if is_older(stored) {
        return older(stored);
    }
    let (line, payload) = stored.split_once('\n').ok_or_else(|| corrupt("layout"))?;
    let tokens: Vec<&str> = line.splitn(TOKENS, ' ').collect();
    let [
        seq,
        status,
        delivered_to,
        deliveries,
        lease,
        created,
        deadline,
        finished,
        flags,
        hash,
        correlation_id,
        tool_id,
        function_name,
        caller,
    ] = <[&str; TOKENS]>::try_from(tokens).map_err(|_| corrupt("layout"))?;
    let created_at = time(created).ok_or_else(|| corrupt("creation time"))?;
    let after = |offset: &str| -> Result<Option<Timestamp>, StoreError> {
        match offset {
            "" => Ok(None),
            offset => offset
                .parse::<i64>()
                .map(|offset| Some(Timestamp(created_at.0 + offset)))
                .map_err(|_| corrupt("times")),
        }
    };
    let flags: u8 = flags.parse().map_err(|_| corrupt("flags"))?;
    let name = |token: &str| (!token.is_empty()).then(|| unescaped(token));
    let mut record = RequestRecord {
        id: id.to_owned(),
        seq: seq.parse().map_err(|_| corrupt("queue position"))?,
        tool_id: name(tool_id),
        function_name: unescaped(function_name),
        args: Value::Null,
        status: status_of_letter(status)?,
        created_at,
        deadline: after(deadline)?.ok_or_else(|| corrupt("deadline"))?,
        delivered_to: name(delivered_to),
        lease_until: after(lease)?,
        deliveries: deliveries.parse().unwrap_or(0),
        response: None,
        finished_at: after(finished)?,
        builtin: flags & 1 != 0,
        correlation_id: name(correlation_id),
        call_hash: hash_of(hash),
        evicted: flags & 2 != 0,
        caller: name(caller),
    };
    match (record.finished_at, payload) {
        (None, "") => {}
        (None, args) => {
            record.args = serde_json::from_str(args).map_err(|_| corrupt("arguments"))?;
        }
        (Some(_), answer) => record.response = finished_answer(&record, answer)?,
    }
    Ok(record)
}

/// A finished call's answer from what its record keeps ('' for none).
fn finished_answer(record: &RequestRecord, kept: &str) -> Result<Option<ToolResponse>, StoreError> {
    Ok(match kept {
        // An expired call's answer is written here, where its message is.
        "" if record.status == RequestStatus::Expired && !record.evicted => {
            Some(record.expired_response())
        }
        "" => None,
        kept => Some(answer_of(kept, &record.id)?),
    })
}

/// Whether a stored call (or a message) is in an older relay's layout: it starts
/// `<length>:`, where this layout's starts `<seq> `.
fn is_older(packed: &str) -> bool {
    let digits = packed.bytes().take_while(u8::is_ascii_digit).count();
    digits > 0 && packed.as_bytes().get(digits) == Some(&b':')
}

/// A call an older relay packed: 18 fields (17 before it kept the caller, then unknown), each
/// `<length>:<value>`, in the order id, seq, tool, function, arguments, status, created,
/// deadline, delivered to, lease, deliveries, answer, finished, built-in, correlation id, hash,
/// evicted, caller.
fn older(mut packed: &str) -> Result<RequestRecord, StoreError> {
    let mut fields = Vec::with_capacity(18);
    while !packed.is_empty() {
        let (length, rest) = packed.split_once(':').ok_or_else(|| corrupt("layout"))?;
        let length: usize = length.parse().map_err(|_| corrupt("layout"))?;
        let field = rest.get(..length).ok_or_else(|| corrupt("layout"))?;
        fields.push(field);
        packed = &rest[length..];
    }
    match fields.len() {
        18 => {}
        17 => fields.push(""),
        _ => return Err(corrupt("layout")),
    }
    let args = match fields[4] {
        "" => Value::Null,
        args => serde_json::from_str(args).map_err(|_| corrupt("arguments"))?,
    };
    let mut record = RequestRecord {
        id: fields[0].to_owned(),
        seq: fields[1].parse().map_err(|_| corrupt("queue position"))?,
        tool_id: optional(fields[2]),
        function_name: fields[3].to_owned(),
        args,
        status: status_of(fields[5])?,
        created_at: time(fields[6]).ok_or_else(|| corrupt("creation time"))?,
        deadline: time(fields[7]).ok_or_else(|| corrupt("deadline"))?,
        delivered_to: optional(fields[8]),
        lease_until: time(fields[9]),
        deliveries: fields[10].parse().unwrap_or(0),
        response: None,
        finished_at: time(fields[12]),
        builtin: fields[13] == "1",
        correlation_id: optional(fields[14]),
        call_hash: hash_of(fields[15]),
        evicted: fields[16] == "1",
        caller: optional(fields[17]),
    };
    record.response = finished_answer(&record, fields[11])?;
    Ok(record)
}

fn status_of(name: &str) -> Result<RequestStatus, StoreError> {
    Ok(match name {
        "queued" => RequestStatus::Queued,
        "delivered" => RequestStatus::Delivered,
        "completed" => RequestStatus::Completed,
        "failed" => RequestStatus::Failed,
        "expired" => RequestStatus::Expired,
        "cancelled" => RequestStatus::Cancelled,
        "awaiting_approval" => RequestStatus::AwaitingApproval,
        _ => return Err(corrupt("status")),
    })
}

/// An answer as a call's record keeps it: `=` and the result's JSON for an answer that is a
/// result alone (most), else its JSON without the request id, which is the record's own.
pub(super) fn stored_answer(response: &ToolResponse) -> Result<String, StoreError> {
    #[derive(serde::Serialize)]
    struct Stored<'a> {
        success: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a ToolError>,
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<&'a Vec<Value>>,
        #[serde(rename = "structuredContent", skip_serializing_if = "Option::is_none")]
        structured_content: Option<&'a Value>,
    }
    let written = match response {
        ToolResponse {
            success: true,
            result: Some(result),
            error: None,
            content: None,
            structured_content: None,
            ..
        } => serde_json::to_string(result).map(|result| format!("={result}")),
        _ => serde_json::to_string(&Stored {
            success: response.success,
            result: response.result.as_ref(),
            error: response.error.as_ref(),
            content: response.content.as_ref(),
            structured_content: response.structured_content.as_ref(),
        }),
    };
    written.map_err(|error| StoreError(format!("an answer cannot be stored: {error}")))
}

/// An answer kept in the record of call `id` ([`stored_answer`]; one kept whole, with its
/// request id, as an older relay and the approval script keep it, reads the same).
fn answer_of(stored: &str, id: &str) -> Result<ToolResponse, StoreError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Stored {
        #[serde(default)]
        request_id: Option<String>,
        success: bool,
        #[serde(default)]
        result: Option<Value>,
        #[serde(default)]
        error: Option<ToolError>,
        #[serde(default)]
        content: Option<Vec<Value>>,
        #[serde(default)]
        structured_content: Option<Value>,
    }
    if let Some(result) = stored.strip_prefix('=') {
        return Ok(ToolResponse {
            request_id: id.to_owned(),
            success: true,
            result: Some(serde_json::from_str(result).map_err(|_| corrupt("answer"))?),
            error: None,
            content: None,
            structured_content: None,
        });
    }
    let stored: Stored = serde_json::from_str(stored).map_err(|_| corrupt("answer"))?;
    Ok(ToolResponse {
        request_id: stored.request_id.unwrap_or_else(|| id.to_owned()),
        success: stored.success,
        result: stored.result,
        error: stored.error,
        content: stored.content,
        structured_content: stored.structured_content,
    })
}

/// A session as the scripts answer it (`session_values` in `lua/library.lua`).
pub(super) fn session(values: &[String]) -> Result<SessionRecord, StoreError> {
    let field = |name: SessionField| values.get(name as usize).map_or("", String::as_str);
    let time = |name: SessionField| Timestamp(field(name).parse().unwrap_or(0));
    let code = SessionCode::parse(field(SessionField::Code))
        .map_err(|_| StoreError("a stored session has no code".into()))?;
    let provider =
        optional(field(SessionField::ProviderConnection)).map(|connection_id| ProviderInfo {
            connection_id,
            transport: Transport::parse(field(SessionField::ProviderTransport))
                .unwrap_or(Transport::WebSocket),
            connected_at: time(SessionField::ProviderConnectedAt),
            last_seen: time(SessionField::ProviderLastSeen),
        });
    Ok(SessionRecord {
        code,
        token_hash: field(SessionField::TokenHash).to_owned(),
        created_at: time(SessionField::CreatedAt),
        expires_at: time(SessionField::ExpiresAt),
        max_expires_at: time(SessionField::MaxExpiresAt),
        provider,
        manifest_revision: field(SessionField::ManifestRevision).parse().unwrap_or(0),
        mcp_handle: field(SessionField::McpHandle).to_owned(),
    })
}

/// A session script's `{ calls it expired, the expiry it slid the session to, answer }`.
pub(super) fn counted(
    answer: redis::Value,
) -> Result<(u64, Option<i64>, redis::Value), StoreError> {
    let redis::Value::Array(items) = answer else {
        return Err(missing("count of what the script expired"));
    };
    let mut items = items.into_iter();
    let mut number = || match items.next() {
        Some(redis::Value::Int(count)) => Ok(count),
        _ => Err(missing("count of what the script expired")),
    };
    let (expired, slid_to) = (number()?, number()?);
    // A script answering nothing (nil) leaves the third place empty.
    Ok((
        expired.unsigned_abs(),
        (slid_to > 0).then_some(slid_to),
        items.next().unwrap_or(redis::Value::Nil),
    ))
}

pub(super) fn unreadable(error: redis::ParsingError) -> StoreError {
    StoreError(format!("an unreadable answer from Redis: {error}"))
}

pub(super) fn missing(what: &str) -> StoreError {
    StoreError(format!("Redis answered without the {what}"))
}

pub(super) fn unexpected(outcome: &str) -> StoreError {
    StoreError(format!(
        "an unexpected answer from a Redis script: {outcome:?}"
    ))
}

/// A script's `{ outcome, packed call?, … }` answer, split.
pub(super) fn outcome(answer: redis::Value) -> Result<(String, Vec<redis::Value>), StoreError> {
    match answer {
        redis::Value::Array(mut items) if !items.is_empty() => {
            let tag = redis::from_redis_value(items.remove(0)).map_err(unreadable)?;
            Ok((tag, items))
        }
        other => Err(StoreError(format!(
            "an unexpected answer from Redis: {other:?}"
        ))),
    }
}

/// Whether a flat script's answer is `{ 'slow' }`: off its common path, for the library's
/// script to decide.
pub(super) fn is_slow(answer: &redis::Value) -> bool {
    let redis::Value::Array(items) = answer else {
        return false;
    };
    match items.first() {
        Some(redis::Value::BulkString(outcome)) => outcome.as_slice() == b"slow",
        Some(redis::Value::SimpleString(outcome)) => outcome == "slow",
        _ => false,
    }
}

/// A call the flat queueing script queued (`lua/flat_enqueue.lua`'s short answer `{ 'queued',
/// its place in the queue, the connection it was handed to or '', the session's provider
/// (connection, transport, connected at, last seen), where it is routed, the session's expiry,
/// its maximum and its manifest's revision }`): `queued` as made here with what only the
/// session knew, the session as far as the answer tells it (not its token hash, creation or
/// handle), and where the call is routed ('' for nowhere). Any other answer gives `queued`
/// back.
pub(super) fn flat_queued(
    queued: RequestRecord,
    code: &SessionCode,
    answer: &redis::Value,
) -> Result<Result<(RequestRecord, SessionRecord, String), RequestRecord>, StoreError> {
    let redis::Value::Array(items) = answer else {
        return Ok(Err(queued));
    };
    if !matches!(items.first(), Some(redis::Value::BulkString(tag)) if tag.as_slice() == b"queued")
    {
        return Ok(Err(queued));
    }
    let values: Vec<String> = redis::from_redis_value(answer.clone()).map_err(unreadable)?;
    let [
        _,
        seq,
        handed,
        connection,
        transport,
        connected_at,
        last_seen,
        routed,
        expires_at,
        max_expires_at,
        revision,
    ] = <[String; 11]>::try_from(values).map_err(|_| missing("queued call's state"))?;
    let mut record = queued;
    record.seq = seq.parse().map_err(|_| corrupt("queue position"))?;
    if !handed.is_empty() {
        // As the script packed it (and the library's enqueue.lua does): delivered, leased
        // until its deadline, once.
        record.status = RequestStatus::Delivered;
        record.delivered_to = Some(handed);
        record.lease_until = Some(record.deadline);
        record.deliveries = 1;
    }
    let provider = optional(&connection).map(|connection_id| ProviderInfo {
        connection_id,
        transport: Transport::parse(&transport).unwrap_or(Transport::WebSocket),
        connected_at: time(&connected_at).unwrap_or(Timestamp(0)),
        last_seen: time(&last_seen).unwrap_or(Timestamp(0)),
    });
    // What a caller of `enqueue_checked` may read after a queued call (see there).
    let session = SessionRecord {
        code: code.clone(),
        token_hash: String::new(),
        created_at: Timestamp(0),
        expires_at: time(&expires_at).ok_or_else(|| corrupt("session's expiry"))?,
        max_expires_at: time(&max_expires_at).unwrap_or(Timestamp(0)),
        provider,
        manifest_revision: revision.parse().unwrap_or(0),
        mcp_handle: String::new(),
    };
    Ok(Ok((record, session, routed)))
}

/// The packed call in `value`, read; `None` for nil or false.
pub(super) fn call_in(value: Option<redis::Value>) -> Result<Option<RequestRecord>, StoreError> {
    match value {
        None | Some(redis::Value::Nil | redis::Value::Boolean(false)) => Ok(None),
        Some(value) => {
            let packed: String = redis::from_redis_value(value).map_err(unreadable)?;
            unpack(&packed).map(Some)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewRequest;
    use toolrelay::wire::ToolResponse;

    fn queued(builtin: bool, caller: Option<&str>) -> RequestRecord {
        RequestRecord::queued(
            NewRequest {
                id: "r:1".into(),
                tool_id: Some("demo tool".into()),
                function_name: "echo".into(),
                args: serde_json::json!({"text": "a:b\n1:2 %20", "n": 1.5}),
                created_at: Timestamp(1_700_000_000_000),
                deadline: Timestamp(1_700_000_060_000),
                builtin,
                correlation_id: Some("c-1".into()),
                caller: caller.map(str::to_owned),
            },
            0,
        )
    }

    /// The pieces `flat_enqueue.lua` joins, joined as it joins them, are the call as stored:
    /// as made here (queued, or a built-in call delivered to the relay) and handed to a tab.
    #[test]
    fn a_queued_call_s_pieces_join_into_the_call_as_stored() {
        for builtin in [false, true] {
            let mut record = queued(builtin, Some("mcp:0123456789abcdef01234567"));
            let [state, rest] = pieces(&record);
            record.seq = 12;
            assert_eq!(format!("12 {state} {rest}"), stored(&record));
            record.status = RequestStatus::Delivered;
            record.delivered_to = Some("tab-1".into());
            record.lease_until = Some(record.deadline);
            record.deliveries = 1;
            let handed = format!("12 d tab-1 1 {} {rest}", handed_lease(&record));
            assert_eq!(handed, stored(&record));
            assert_eq!(unpack(&format!("r:1 {handed}")).unwrap(), record);
        }
    }

    #[test]
    fn a_call_reads_back_as_it_was_packed() {
        let mut record = queued(false, Some("u:a user%with spaces\nand a newline"));
        record.seq = 7;
        record.call_hash = crate::store::call_hash(Some("demo"), "echo", &record.args);
        assert_eq!(unpack(&pack(&record)).unwrap(), record);
        // Finished: the arguments go, the answer is kept — as a result alone, or whole.
        record.args = Value::Null;
        record.status = RequestStatus::Completed;
        record.finished_at = Some(Timestamp(1_700_000_001_000));
        for response in [
            ToolResponse {
                request_id: "r:1".into(),
                success: true,
                result: Some(serde_json::json!("é:3\n")),
                error: None,
                content: None,
                structured_content: None,
            },
            ToolResponse {
                request_id: "r:1".into(),
                success: false,
                result: None,
                error: Some(ToolError {
                    code: "bad".into(),
                    message: "no = here".into(),
                }),
                content: None,
                structured_content: None,
            },
        ] {
            record.response = Some(response);
            assert_eq!(unpack(&pack(&record)).unwrap(), record);
        }
        // Finished before it was created by another replica's clock: read the same.
        record.finished_at = Some(Timestamp(1_699_999_999_000));
        assert_eq!(unpack(&pack(&record)).unwrap(), record);
        assert!(unpack("r:1 3 q").is_err(), "a short record is refused");
        assert!(unpack("3:abc").is_err(), "a short older record is refused");
    }

    /// A finished call's record beyond its answer stays within what the budget can count
    /// (`a_finished_call_keeps_no_more_in_redis_than_the_budget_counts` measures it in Redis).
    #[test]
    fn a_finished_call_is_stored_in_little_more_than_its_answer() {
        let mut record = queued(false, Some("k:0123456789abcdef0123456789"));
        record.seq = 480;
        record.tool_id = Some("demo".into());
        record.delivered_to = Some(crate::code::random_id());
        record.deliveries = 1;
        record.args = Value::Null;
        record.status = RequestStatus::Completed;
        record.correlation_id = None;
        record.finished_at = Some(Timestamp(record.created_at.0 + 3));
        let result = serde_json::json!({"text": "hello 480"});
        record.response = Some(ToolResponse {
            request_id: "r:1".into(),
            success: true,
            result: Some(result.clone()),
            error: None,
            content: None,
            structured_content: None,
        });
        let beyond = stored(&record).len() - result.to_string().len();
        assert!(
            beyond <= 135,
            "{beyond} bytes beyond the answer: {}",
            stored(&record)
        );
    }

    /// What an older relay packed (18 fields, or 17 without the caller) still reads; its hash
    /// (64 hex digits) reads as its first 16 bytes, which is what a call hashes to now.
    #[test]
    fn an_older_relay_s_call_still_reads() {
        let field = |value: &str| format!("{}:{value}", value.len());
        let hash = "271c39a7dec27942beec6dc1106b3674376057f05ecbac47ed74d8d94d5f186a";
        let fields = [
            "r:1",
            "7",
            "demo",
            "echo",
            r#"{"a":1}"#,
            "completed",
            "1700000000000",
            "1700000060000",
            "tab-1",
            "",
            "1",
            r#"{"requestId":"r:1","success":true,"result":2}"#,
            "1700000001000",
            "0",
            "",
            hash,
            "0",
        ];
        let older: String = fields.iter().map(|value| field(value)).collect();
        let read = unpack(&older).unwrap();
        assert_eq!(read.caller, None);
        assert_eq!(read.call_hash, hash[..32]);
        assert_eq!(read.status, RequestStatus::Completed);
        assert_eq!(read.response.unwrap().result, Some(serde_json::json!(2)));
        // As the library answers it read from a session's hash: its id, then the record.
        let with_caller = format!("{older}{}", field("k:1"));
        let read = unpack(&format!("r:1 {with_caller}")).unwrap();
        assert_eq!(read.caller.as_deref(), Some("k:1"));
        assert_eq!(read.seq, 7);
    }
}
