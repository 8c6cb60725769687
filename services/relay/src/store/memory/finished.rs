//! A session's finished calls as the memory store keeps them for the retention time: what
//! each record must still answer (its status, times, the call's hash, who it was delivered
//! to, its answer) in a fraction of a [`RequestRecord`]'s room.
//!
//! A finished call is one slot of a queue in the order the calls finished (no arguments, no
//! correlation id, the hash as bytes, the names as places in a table shared by the session's
//! other calls) and one allocation: its id, then its answer as JSON text, read back when asked
//! for. The calls are numbered as they finish; the table that finds one by its id holds only
//! its number, so the id is kept once. What it all costs is measured by
//! `services/relay/tests/finished_calls.rs`.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::num::NonZeroU32;
use std::sync::Arc;

use hashbrown::HashTable;
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use crate::clock::Timestamp;
use crate::store::RequestRecord;
use crate::store::rules;

/// A session's finished calls, oldest first.
#[derive(Default)]
pub(super) struct FinishedCalls {
    /// The calls by number, from `first` on; `None` where one was forgotten out of turn.
    calls: VecDeque<Option<Done>>,
    /// The number of the call at the front.
    first: u64,
    /// The numbers of the calls kept, found by their ids' hashes.
    by_id: HashTable<u64>,
    hasher: RandomState,
    /// No call before this number has its answer kept (answers go oldest first).
    kept_from: u64,
    /// The tool, function and connection names of the calls, one copy of each.
    names: Names,
}

/// A finished call.
pub(super) struct Done {
    /// Its id, then, while its answer is written out, the answer's result and error as JSON.
    text: Box<str>,
    seq: u64,
    created_at: Timestamp,
    deadline: Timestamp,
    finished_at: Timestamp,
    /// What it costs against the answer budgets while its answer is kept.
    cost: usize,
    call_hash: [u8; crate::store::CALL_HASH_BYTES],
    id_len: u32,
    /// The length of the result's JSON after the id (0: no result).
    result_len: u32,
    tool_id: Option<NonZeroU32>,
    function_name: Option<NonZeroU32>,
    delivered_to: Option<NonZeroU32>,
    /// Who made it (its caller's key): its answer is that caller's alone.
    caller: Option<NonZeroU32>,
    deliveries: u32,
    status: RequestStatus,
    builtin: bool,
    answer: Kept,
}

/// What a finished call keeps of its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kept {
    /// Nothing: the budget needed the room.
    Evicted,
    /// Its text, after the id.
    Written { success: bool },
    /// The answer of a call that expired ([`RequestRecord::expired_response`]), written
    /// again from the record when it is read.
    Expired,
}

/// Names kept once, each known by its place (from 1).
#[derive(Default)]
struct Names {
    list: Vec<Arc<str>>,
    places: HashMap<Arc<str>, NonZeroU32>,
}

impl Names {
    /// The place of `name`, kept from now on if it is new.
    fn keep(&mut self, name: &str) -> Option<NonZeroU32> {
        if let Some(place) = self.places.get(name) {
            return Some(*place);
        }
        let place = u32::try_from(self.list.len() + 1)
            .ok()
            .and_then(NonZeroU32::new)?;
        let name: Arc<str> = Arc::from(name);
        self.list.push(Arc::clone(&name));
        self.places.insert(name, place);
        Some(place)
    }

    fn get(&self, place: Option<NonZeroU32>) -> Option<&str> {
        let index = usize::try_from(place?.get()).ok()? - 1;
        self.list.get(index).map(|name| &**name)
    }
}

impl FinishedCalls {
    /// How many are kept.
    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// The call `id`.
    pub(super) fn get(&self, id: &str) -> Option<&Done> {
        self.at(self.number_of(id)?)
    }

    /// The number of the call `id`.
    fn number_of(&self, id: &str) -> Option<u64> {
        let hash = self.hasher.hash_one(id);
        let calls = (&self.calls, self.first);
        self.by_id
            .find(hash, |&number| id_at(calls, number) == Some(id))
            .copied()
    }

    /// The call numbered `number`, unless it is forgotten.
    pub(super) fn at(&self, number: u64) -> Option<&Done> {
        let index = usize::try_from(number.checked_sub(self.first)?).ok()?;
        self.calls.get(index)?.as_ref()
    }

    fn at_mut(&mut self, number: u64) -> Option<&mut Done> {
        let index = usize::try_from(number.checked_sub(self.first)?).ok()?;
        self.calls.get_mut(index)?.as_mut()
    }

    /// Files `record`, finished with `response` at `finished_at` at `cost`; returns its
    /// number. Its id must not be taken.
    pub(super) fn push(
        &mut self,
        record: &RequestRecord,
        status: RequestStatus,
        response: &ToolResponse,
        finished_at: Timestamp,
        cost: usize,
    ) -> u64 {
        let names = [
            record
                .tool_id
                .as_deref()
                .and_then(|name| self.names.keep(name)),
            self.names.keep(&record.function_name),
            record
                .delivered_to
                .as_deref()
                .and_then(|name| self.names.keep(name)),
            record
                .caller
                .as_deref()
                .and_then(|name| self.names.keep(name)),
        ];
        let done = Done::new(record, names, status, response, finished_at, cost);
        let number = self.first + self.calls.len() as u64;
        let hash = self.hasher.hash_one(done.id());
        let (calls, first, hasher) = (&self.calls, self.first, &self.hasher);
        self.by_id.insert_unique(hash, number, |&number| {
            hasher.hash_one(id_at((calls, first), number).unwrap_or_default())
        });
        self.calls.push_back(Some(done));
        number
    }

    /// The number of the oldest call kept.
    pub(super) fn oldest(&self) -> Option<u64> {
        // Forgotten slots never stay at the front.
        (!self.calls.is_empty()).then_some(self.first)
    }

    /// The number of the oldest call whose answer is kept.
    pub(super) fn oldest_kept(&mut self) -> Option<u64> {
        let end = self.first + self.calls.len() as u64;
        self.kept_from = self.kept_from.max(self.first);
        while self.kept_from < end {
            if self.at(self.kept_from).is_some_and(Done::has_answer) {
                return Some(self.kept_from);
            }
            self.kept_from += 1;
        }
        None
    }

    /// Drops the answer of call `number`, keeping its record, which costs
    /// [`rules::expired_cost`] from then on; returns the bytes freed, or `None` when it had
    /// no answer kept.
    pub(super) fn evict(&mut self, number: u64) -> Option<usize> {
        let done = self.at_mut(number).filter(|done| done.has_answer())?;
        let cost = rules::expired_cost(done.id());
        let freed = done.cost.saturating_sub(cost);
        done.cost -= freed;
        done.text = Box::from(done.id());
        done.result_len = 0;
        done.answer = Kept::Evicted;
        Some(freed)
    }

    /// Forgets call `number`; returns it.
    pub(super) fn forget(&mut self, number: u64) -> Option<Done> {
        let index = usize::try_from(number.checked_sub(self.first)?).ok()?;
        let done = self.calls.get_mut(index)?.take()?;
        let hash = self.hasher.hash_one(done.id());
        if let Ok(found) = self.by_id.find_entry(hash, |&kept| kept == number) {
            found.remove();
        }
        while let Some(None) = self.calls.front() {
            self.calls.pop_front();
            self.first += 1;
        }
        Some(done)
    }

    /// The whole record of `done`, one of these calls.
    pub(super) fn record(&self, done: &Done) -> RequestRecord {
        let mut record = self.bare_record(done);
        record.response = self.response(done);
        record.evicted = !done.has_answer();
        record
    }

    /// The answer of `done`, one of these calls, while it is kept.
    pub(super) fn response(&self, done: &Done) -> Option<ToolResponse> {
        match done.answer {
            Kept::Evicted => None,
            Kept::Expired => Some(self.bare_record(done).expired_response()),
            Kept::Written { success } => {
                let (result, rest) = done.answer_json();
                // Written by this store from a `Value` and a `Rest`: they read back.
                let rest: Rest = rest
                    .and_then(|json| serde_json::from_str(json).ok())
                    .unwrap_or_default();
                Some(ToolResponse {
                    request_id: done.id().to_owned(),
                    success,
                    result: result.and_then(|json| serde_json::from_str(json).ok()),
                    error: rest.error,
                    content: rest.content,
                    structured_content: rest.structured_content,
                })
            }
        }
    }

    /// The kept answers of the calls `caller` made (and of those whose caller is unknown), in
    /// the order the calls were queued; every kept answer when `caller` is `None`.
    pub(super) fn responses(&self, caller: Option<&str>) -> Vec<ToolResponse> {
        let mine = |done: &Done| match (caller, self.names.get(done.caller)) {
            (Some(reader), Some(maker)) => reader == maker,
            _ => true,
        };
        let mut answered: Vec<&Done> = self
            .calls
            .iter()
            .flatten()
            .filter(|done| done.has_answer() && mine(done))
            .collect();
        answered.sort_by_key(|done| done.seq);
        answered
            .into_iter()
            .filter_map(|done| self.response(done))
            .collect()
    }

    /// The record of `done` without its answer.
    fn bare_record(&self, done: &Done) -> RequestRecord {
        let name = |place| self.names.get(place).map(str::to_owned);
        RequestRecord {
            id: done.id().to_owned(),
            seq: done.seq,
            tool_id: name(done.tool_id),
            function_name: name(done.function_name).unwrap_or_default(),
            args: Value::Null,
            status: done.status,
            created_at: done.created_at,
            deadline: done.deadline,
            delivered_to: name(done.delivered_to),
            lease_until: None,
            deliveries: done.deliveries,
            response: None,
            finished_at: Some(done.finished_at),
            builtin: done.builtin,
            correlation_id: None,
            caller: name(done.caller),
            call_hash: data_encoding::HEXLOWER.encode(&done.call_hash),
            evicted: false,
        }
    }
}

/// The id of call `number` of `calls`, whose front is numbered `first`.
fn id_at((calls, first): (&VecDeque<Option<Done>>, u64), number: u64) -> Option<&str> {
    let index = usize::try_from(number.checked_sub(first)?).ok()?;
    calls.get(index)?.as_ref().map(Done::id)
}

impl Done {
    /// `record`, finished with `response` at `finished_at`, its names at `names` (tool,
    /// function, connection, caller).
    fn new(
        record: &RequestRecord,
        [tool_id, function_name, delivered_to, caller]: [Option<NonZeroU32>; 4],
        status: RequestStatus,
        response: &ToolResponse,
        finished_at: Timestamp,
        cost: usize,
    ) -> Self {
        let mut call_hash = [0; crate::store::CALL_HASH_BYTES];
        // Every record's hash is one this crate wrote: 32 hex digits.
        let _ = data_encoding::HEXLOWER.decode_mut(record.call_hash.as_bytes(), &mut call_hash);
        let mut text = record.id.clone();
        let mut result_len = 0;
        let answer = if status == RequestStatus::Expired && *response == record.expired_response() {
            Kept::Expired
        } else {
            if let Some(result) = &response.result {
                write_json(&mut text, result);
                result_len = text.len() - record.id.len();
            }
            let rest = Rest {
                error: response.error.clone(),
                content: response.content.clone(),
                structured_content: response.structured_content.clone(),
            };
            if rest != Rest::default() {
                write_json(&mut text, &rest);
            }
            Kept::Written {
                success: response.success,
            }
        };
        Self {
            text: text.into_boxed_str(),
            seq: record.seq,
            created_at: record.created_at,
            deadline: record.deadline,
            finished_at,
            cost,
            call_hash,
            id_len: length(record.id.len()),
            result_len: length(result_len),
            tool_id,
            function_name,
            delivered_to,
            caller,
            deliveries: record.deliveries,
            status,
            builtin: record.builtin,
            answer,
        }
    }

    /// Its id.
    pub(super) fn id(&self) -> &str {
        self.text.get(..self.id_len as usize).unwrap_or_default()
    }

    /// What it costs against the answer budgets now.
    pub(super) fn cost(&self) -> usize {
        self.cost
    }

    /// Whether its answer is still kept.
    pub(super) fn has_answer(&self) -> bool {
        self.answer != Kept::Evicted
    }

    /// Whether `call_hash` (hex) is this call's.
    pub(super) fn is_call(&self, call_hash: &str) -> bool {
        data_encoding::HEXLOWER.encode(&self.call_hash) == call_hash
    }

    /// Its answer's result, and the rest of it ([`Rest`]), as the JSON written.
    fn answer_json(&self) -> (Option<&str>, Option<&str>) {
        let answer = self.text.get(self.id_len as usize..).unwrap_or_default();
        let (result, error) = answer.split_at(answer.len().min(self.result_len as usize));
        let written = (!result.is_empty()).then_some(result);
        (written, (!error.is_empty()).then_some(error))
    }
}

/// An answer's parts besides its result, as a finished call keeps them after it.
#[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Rest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<toolrelay::wire::ToolError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<Vec<serde_json::Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    structured_content: Option<serde_json::Value>,
}

/// Appends `value` to `text` as JSON.
fn write_json(text: &mut String, value: &impl serde::Serialize) {
    // A `Value` or a `ToolError` always serializes: string keys, no fallible serializer.
    if let Ok(json) = serde_json::to_string(value) {
        text.push_str(&json);
    }
}

/// A length within one call's text, which the request and response body limits keep far
/// below 4 GiB.
fn length(bytes: usize) -> u32 {
    u32::try_from(bytes).unwrap_or(u32::MAX)
}
