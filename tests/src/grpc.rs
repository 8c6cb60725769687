//! gRPC requests to a relay as the relay suites write them: calls of a session's tools (`Call`
//! and `Submit`), and the result a call's state holds.

use serde_json::Value;
use toolrelay::json::{from_value, to_struct};
use toolrelay::proto::v1::{self as pb, CallRequest, SubmitRequest};

use crate::BUILTIN_TOOLS;

/// The built-in tools every session offers besides the tab's.
pub const BUILTINS: u32 = BUILTIN_TOOLS.len() as u32;

/// A `Call` of `function` with `args` in session `code`, waiting up to 10 s for the answer.
pub fn call(code: &str, function: &str, args: Value) -> CallRequest {
    CallRequest {
        code: code.into(),
        function_name: function.into(),
        args: Some(to_struct(&args)),
        timeout_ms: 10_000,
        ..CallRequest::default()
    }
}

/// A `Submit` of `function` with `args` in session `code` as `request_id` (empty: a new id).
pub fn submit(code: &str, request_id: &str, function: &str, args: Value) -> SubmitRequest {
    SubmitRequest {
        code: code.into(),
        request_id: request_id.into(),
        function_name: function.into(),
        args: Some(to_struct(&args)),
        ..SubmitRequest::default()
    }
}

/// The result of a call that succeeded; panics if it has no answer or failed.
pub fn result_of(state: &pb::RequestState) -> Value {
    let response = state.response.as_ref().expect("a response");
    assert!(response.success, "{response:?}");
    from_value(response.result.as_ref().unwrap())
}
