//! How the Redis store writes a call and reads back calls and sessions: a call is one string,
//! its fields (`FIELDS`, the order `lua/library.lua` spells too) each as `<length>:<value>`; a
//! session is the values of `SESSION_FIELDS` in order.

use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolError, ToolResponse};

use crate::clock::Timestamp;
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::store::{ProviderInfo, RequestRecord, SessionRecord, Transport};

/// A call's fields, in the order they are packed (`FIELDS` in `lua/library.lua`).
const FIELDS: usize = 18;
/// The fields of a call packed before its caller was kept (an older relay's, read during a
/// rolling upgrade): the caller is then unknown.
const FIELDS_BEFORE_CALLER: usize = 17;

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

/// A call packed as the scripts keep it.
pub(super) fn pack(record: &RequestRecord) -> String {
    join(&values(record))
}

/// A newly queued call in the pieces `lua/flat_enqueue.lua` joins around what only the
/// session knows (its place in the queue, and whom it is handed to): `[head, middle, state,
/// times, tail]` — the id; tool, function and arguments; status to deliveries as made here;
/// created and deadline; answer to caller.
pub(super) fn pieces(record: &RequestRecord) -> [String; 5] {
    let values = values(record);
    [
        join(&values[..1]),
        join(&values[2..5]),
        join(&values[5..11]),
        join(&values[6..8]),
        join(&values[11..]),
    ]
}

/// `fields`, each as `<length>:<value>`, one after the other.
fn join(fields: &[String]) -> String {
    let mut packed = String::with_capacity(fields.iter().map(|field| field.len() + 4).sum());
    for field in fields {
        packed.push_str(&field.len().to_string());
        packed.push(':');
        packed.push_str(field);
    }
    packed
}

/// A call's fields as the scripts keep them, in `FIELDS` order.
fn values(record: &RequestRecord) -> [String; FIELDS] {
    let number = |value: i64| value.to_string();
    [
        record.id.clone(),
        record.seq.to_string(),
        record.tool_id.clone().unwrap_or_default(),
        record.function_name.clone(),
        if record.args.is_null() {
            String::new()
        } else {
            record.args.to_string()
        },
        record.status.as_str().to_owned(),
        number(record.created_at.0),
        number(record.deadline.0),
        record.delivered_to.clone().unwrap_or_default(),
        record
            .lease_until
            .map(|lease| number(lease.0))
            .unwrap_or_default(),
        record.deliveries.to_string(),
        match &record.response {
            Some(response) => stored_answer(response).unwrap_or_default(),
            None => String::new(),
        },
        record
            .finished_at
            .map(|at| number(at.0))
            .unwrap_or_default(),
        if record.builtin { "1" } else { "0" }.to_owned(),
        record.correlation_id.clone().unwrap_or_default(),
        record.call_hash.clone(),
        if record.evicted { "1" } else { "0" }.to_owned(),
        record.caller.clone().unwrap_or_default(),
    ]
}

fn corrupt(what: &str) -> StoreError {
    StoreError(format!("a stored call's {what} is unreadable"))
}

/// Splits a packed call into its fields.
fn fields(mut packed: &str) -> Result<Vec<&str>, StoreError> {
    let mut fields = Vec::with_capacity(FIELDS);
    while !packed.is_empty() {
        let (length, rest) = packed.split_once(':').ok_or_else(|| corrupt("layout"))?;
        let length: usize = length.parse().map_err(|_| corrupt("layout"))?;
        let field = rest.get(..length).ok_or_else(|| corrupt("layout"))?;
        fields.push(field);
        packed = &rest[length..];
    }
    match fields.len() {
        FIELDS => Ok(fields),
        FIELDS_BEFORE_CALLER => {
            fields.push("");
            Ok(fields)
        }
        _ => Err(corrupt("layout")),
    }
}

fn optional(field: &str) -> Option<String> {
    (!field.is_empty()).then(|| field.to_owned())
}

fn time(field: &str) -> Option<Timestamp> {
    field.parse().ok().map(Timestamp)
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

/// An answer as a call's record keeps it: its JSON without the request id, which is the
/// record's own (47 bytes less per finished call).
pub(super) fn stored_answer(response: &ToolResponse) -> Result<String, StoreError> {
    #[derive(serde::Serialize)]
    struct Stored<'a> {
        success: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<&'a Value>,
        #[serde(skip_serializing_if = "Option::is_none")]
        error: Option<&'a ToolError>,
    }
    serde_json::to_string(&Stored {
        success: response.success,
        result: response.result.as_ref(),
        error: response.error.as_ref(),
    })
    .map_err(|error| StoreError(format!("an answer cannot be stored: {error}")))
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
    }
    let stored: Stored = serde_json::from_str(stored).map_err(|_| corrupt("answer"))?;
    Ok(ToolResponse {
        request_id: stored.request_id.unwrap_or_else(|| id.to_owned()),
        success: stored.success,
        result: stored.result,
        error: stored.error,
    })
}

/// A packed call read back.
pub(super) fn unpack(packed: &str) -> Result<RequestRecord, StoreError> {
    let fields = fields(packed)?;
    let args = match fields[4] {
        "" => Value::Null,
        args => serde_json::from_str(args).map_err(|_| corrupt("arguments"))?,
    };
    let status = status_of(fields[5])?;
    let mut record = RequestRecord {
        id: fields[0].to_owned(),
        seq: fields[1].parse().map_err(|_| corrupt("queue position"))?,
        tool_id: optional(fields[2]),
        function_name: fields[3].to_owned(),
        args,
        status,
        created_at: time(fields[6]).ok_or_else(|| corrupt("creation time"))?,
        deadline: time(fields[7]).ok_or_else(|| corrupt("deadline"))?,
        delivered_to: optional(fields[8]),
        lease_until: time(fields[9]),
        deliveries: fields[10].parse().unwrap_or(0),
        response: None,
        finished_at: time(fields[12]),
        builtin: fields[13] == "1",
        correlation_id: optional(fields[14]),
        call_hash: fields[15].to_owned(),
        evicted: fields[16] == "1",
        caller: optional(fields[17]),
    };
    record.response = match fields[11] {
        "" if status == RequestStatus::Expired && !record.evicted => {
            // An expired call's answer is written here, where its message is.
            Some(record.expired_response())
        }
        "" => None,
        response => Some(answer_of(response, &record.id)?),
    };
    Ok(record)
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
/// handle), and where the call is routed ('' for nowhere). `None` for any other answer.
pub(super) fn flat_queued(
    queued: &RequestRecord,
    code: &SessionCode,
    answer: &redis::Value,
) -> Result<Option<(RequestRecord, SessionRecord, String)>, StoreError> {
    let redis::Value::Array(items) = answer else {
        return Ok(None);
    };
    if !matches!(items.first(), Some(redis::Value::BulkString(tag)) if tag.as_slice() == b"queued")
    {
        return Ok(None);
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
    let mut record = queued.clone();
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
    Ok(Some((record, session, routed)))
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

    /// The pieces `flat_enqueue.lua` joins, joined as it joins them, are the call packed: as
    /// made here (queued, or a built-in call delivered to the relay) and handed to a tab.
    #[test]
    fn a_queued_call_s_pieces_join_into_the_call_packed() {
        let field = |value: &str| format!("{}:{value}", value.len());
        for builtin in [false, true] {
            let mut record = RequestRecord::queued(
                NewRequest {
                    id: "r-1".into(),
                    tool_id: None,
                    function_name: "echo".into(),
                    args: serde_json::json!({"text": "a:b"}),
                    created_at: Timestamp(1_700_000_000_000),
                    deadline: Timestamp(1_700_000_060_000),
                    builtin,
                    correlation_id: None,
                    caller: Some("mcp:0123456789abcdef01234567".into()),
                },
                0,
            );
            let [head, middle, state, times, tail] = pieces(&record);
            record.seq = 12;
            assert_eq!(
                format!("{head}{}{middle}{state}{tail}", field("12")),
                pack(&record)
            );
            record.status = RequestStatus::Delivered;
            record.delivered_to = Some("tab-1".into());
            record.lease_until = Some(record.deadline);
            record.deliveries = 1;
            let handed = format!(
                "{head}{}{middle}{}{times}{}{}{}{tail}",
                field("12"),
                field("delivered"),
                field("tab-1"),
                field("1700000060000"),
                field("1")
            );
            assert_eq!(handed, pack(&record));
        }
    }

    #[test]
    fn a_call_reads_back_as_it_was_packed() {
        let mut record = RequestRecord::queued(
            NewRequest {
                id: "r:1".into(),
                tool_id: Some("demo".into()),
                function_name: "echo".into(),
                args: serde_json::json!({"text": "a:b\n1:2", "n": 1.5}),
                created_at: Timestamp(1_700_000_000_000),
                deadline: Timestamp(1_700_000_060_000),
                builtin: false,
                correlation_id: Some("c-1".into()),
                caller: None,
            },
            7,
        );
        assert_eq!(unpack(&pack(&record)).unwrap(), record);
        record.status = RequestStatus::Completed;
        record.response = Some(ToolResponse {
            request_id: "r:1".into(),
            success: true,
            result: Some(serde_json::json!("é:3")),
            error: None,
        });
        record.finished_at = Some(Timestamp(1_700_000_001_000));
        assert_eq!(unpack(&pack(&record)).unwrap(), record);
        assert!(unpack("3:abc").is_err(), "a short record is refused");
        // A call an older relay packed (no caller field) still reads, its caller unknown.
        record.caller = Some("mcp:0123456789abcdef01234567".into());
        let packed = pack(&record);
        let older = packed
            .strip_suffix("28:mcp:0123456789abcdef01234567")
            .unwrap();
        let read = unpack(older).unwrap();
        assert_eq!(read.caller, None);
        assert_eq!(read.id, record.id);
    }
}
