//! A finished call as the memory store keeps it for the retention time: what its record must
//! still answer (its status, times, the call's hash, who it was delivered to, its answer),
//! in a fraction of a [`RequestRecord`]'s room: no arguments, no correlation id, the hash as
//! bytes, the names shared with the session's other calls, the answer without a copy of the
//! call's id.

use std::sync::Arc;

use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolError, ToolResponse};

use crate::clock::Timestamp;
use crate::store::RequestRecord;

/// A finished call.
pub(super) struct Done {
    pub(super) seq: u64,
    created_at: Timestamp,
    deadline: Timestamp,
    pub(super) finished_at: Timestamp,
    call_hash: [u8; 32],
    tool_id: Option<Arc<str>>,
    function_name: Arc<str>,
    delivered_to: Option<Arc<str>>,
    deliveries: u32,
    status: RequestStatus,
    builtin: bool,
    /// What it costs against the answer budgets while its answer is kept.
    pub(super) cost: usize,
    /// Its answer's place among the session's kept answers.
    pub(super) kept_at: u64,
    /// Its answer; `None` once evicted.
    answer: Option<Box<Answer>>,
}

/// A final answer, without the call's id.
struct Answer {
    success: bool,
    result: Option<Value>,
    error: Option<ToolError>,
}

impl Done {
    /// `record`, finished with `response` at `finished_at`.
    pub(super) fn new(
        record: &RequestRecord,
        (tool_id, function_name, delivered_to): (Option<Arc<str>>, Arc<str>, Option<Arc<str>>),
        status: RequestStatus,
        response: ToolResponse,
        finished_at: Timestamp,
        cost: usize,
        kept_at: u64,
    ) -> Self {
        let mut call_hash = [0; 32];
        // Every record's hash is one this crate wrote: 64 hex digits.
        let _ = data_encoding::HEXLOWER.decode_mut(record.call_hash.as_bytes(), &mut call_hash);
        Self {
            seq: record.seq,
            created_at: record.created_at,
            deadline: record.deadline,
            finished_at,
            call_hash,
            tool_id,
            function_name,
            delivered_to,
            deliveries: record.deliveries,
            status,
            builtin: record.builtin,
            cost,
            kept_at,
            answer: Some(Box::new(Answer {
                success: response.success,
                result: response.result,
                error: response.error,
            })),
        }
    }

    /// Whether its answer is still kept.
    pub(super) fn has_answer(&self) -> bool {
        self.answer.is_some()
    }

    /// Drops its answer (the budget needs the room).
    pub(super) fn evict(&mut self) {
        self.answer = None;
    }

    /// Whether `call_hash` (hex) is this call's.
    pub(super) fn is_call(&self, call_hash: &str) -> bool {
        data_encoding::HEXLOWER.encode(&self.call_hash) == call_hash
    }

    /// Its answer, for the call `id`.
    pub(super) fn response(&self, id: &str) -> Option<ToolResponse> {
        self.answer.as_ref().map(|answer| ToolResponse {
            request_id: id.to_owned(),
            success: answer.success,
            result: answer.result.clone(),
            error: answer.error.clone(),
        })
    }

    /// Its record, as the store's interface gives it, for the call `id`.
    pub(super) fn record(&self, id: &str) -> RequestRecord {
        RequestRecord {
            id: id.to_owned(),
            seq: self.seq,
            tool_id: self.tool_id.as_deref().map(str::to_owned),
            function_name: self.function_name.to_string(),
            args: Value::Null,
            status: self.status,
            created_at: self.created_at,
            deadline: self.deadline,
            delivered_to: self.delivered_to.as_deref().map(str::to_owned),
            lease_until: None,
            deliveries: self.deliveries,
            response: self.response(id),
            finished_at: Some(self.finished_at),
            builtin: self.builtin,
            correlation_id: None,
            call_hash: data_encoding::HEXLOWER.encode(&self.call_hash),
            evicted: self.answer.is_none(),
        }
    }
}
