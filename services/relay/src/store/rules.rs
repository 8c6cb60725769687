//! The rules every store follows, written once: when a call may be handed to a connection,
//! how long a lease lasts, what a kept answer costs, when a session's expiry moves, and the
//! rate budgets' arithmetic (GCRA). The memory store calls these functions; the Redis store's
//! scripts get every constant here in their preamble ([`lua_preamble`]) and spell each rule
//! once in Lua, beside the function it mirrors (`store/redis/*.lua`), and the store
//! conformance suite holds both to the same behaviour.

use std::num::NonZeroU32;
use std::time::Duration;

use toolrelay::wire::{RequestStatus, ToolResponse};

use super::{ApprovalCheck, ApprovalState, ProviderInfo, RequestRecord, Transport};
use crate::clock::Timestamp;

/// How long a replica holds a built-in call it runs without renewing the lease (it renews a
/// third of the way through). A call queued and not yet taken by a run is held by
/// [`super::BUILTIN_CONNECTION`] for as long; a call whose lease ran out is taken over by
/// another replica.
pub const BUILTIN_LEASE: Duration = Duration::from_secs(10);

/// Finished calls kept per session at most (the oldest go first).
pub const MAX_FINISHED_PER_SESSION: usize = 1000;

/// Finished calls whose answer is at most this many bytes are announced whole on the
/// session's events, so that a waiting caller on another replica need not read them.
pub const ANNOUNCED_ANSWER_BYTES: usize = 64 * 1024;

/// What a finished call keeps besides its id and its answer: its record (status, times, the
/// call's hash, its place among the finished ones) and the store's bookkeeping of it. Both
/// stores count it against the answer budget ([`answer_cost`]; an expired call, whose answer
/// is written when it is read, costs this and its id: [`expired_cost`]). Measured with an
/// 11-byte answer, a finished call keeps ~270 bytes in the memory store
/// (`services/relay/tests/finished_calls.rs`); in Redis, as the relay makes calls (a caller's
/// key, a connection's id), 289 bytes beyond its answer, its id included (`MEMORY USAGE`:
/// a field of its session's hash, its entry in the finished list, Redis's own bookkeeping;
/// `tests/store_redis_scripts.rs`), and 176 bytes with its 11-byte answer measured as the
/// growth of all Redis's keys over 200 calls (which also catches their tables growing in
/// steps): this and the id cover both, so the budget bounds what they keep.
pub const FINISHED_CALL_BYTES: usize = 360;

/// The share of the session's time to live by which its expiry must move before a store
/// writes it: activity moves an expiry at most once per tenth of the time to live, so a busy
/// session's keys are not rewritten on every call, and an active session may expire up to a
/// tenth of its time to live earlier than its last activity plus the time to live.
pub const SLIDE_STEP_DIVISOR: i64 = 10;

/// The answer budget's share of one session, by default.
pub const ANSWER_SESSION_SHARE: f64 = 1.0 / 8.0;

/// What a finished call's answer costs against the answer budgets: its record
/// ([`FINISHED_CALL_BYTES`]), its id, and its answer's JSON (estimated the same way in both
/// stores, without writing it out).
pub fn answer_cost(response: &ToolResponse) -> usize {
    FINISHED_CALL_BYTES
        + response.request_id.len()
        + response
            .result
            .as_ref()
            .map_or(0, toolrelay::json::approx_size)
        + response
            .error
            .as_ref()
            .map_or(0, |error| error.code.len() + error.message.len())
        // Images and audio count as the base64 they are kept as.
        + response
            .content
            .iter()
            .flatten()
            .chain(&response.structured_content)
            .map(toolrelay::json::approx_size)
            .sum::<usize>()
}

/// What an expired call costs against the answer budgets: its record and its id (its answer is
/// written when it is read, [`super::RequestRecord::expired_response`]).
pub fn expired_cost(id: &str) -> usize {
    FINISHED_CALL_BYTES + id.len()
}

/// `share` (a fraction, 0 to 1) of `budget` bytes.
pub fn share_of(budget: usize, share: f64) -> usize {
    // Budgets are far below 2^52 bytes: the float holds them exactly.
    (budget as f64 * share.clamp(0.0, 1.0)) as usize
}

/// The connection a new call is handed to the moment it is queued: the session's provider,
/// when it is a connection the relay pushes calls to (not the polling fallback, which asks).
/// The call is then delivered to it (under [`pushed_lease`]) and announced whole, so the
/// connection's replica forwards it without a claim.
pub fn hand_over(provider: Option<&ProviderInfo>, builtin: bool) -> Option<&str> {
    provider
        .filter(|provider| !builtin && provider.transport != Transport::Polling)
        .map(|provider| provider.connection_id.as_str())
}

/// What the person's approvals make of a call about to be queued ([`approval_needed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Approval<'a> {
    /// It goes in.
    Let,
    /// It is held for the person under its caller's approval id.
    Hold(&'a str),
    /// Refused: the session takes no new callers.
    Refused,
    /// Refused: the caller's handle was disconnected.
    Disconnected,
}

/// What the person's approvals make of a call about to be queued (`enqueue.lua` spells the
/// same): let in; held (a caller not allowed yet, using the code, in a session whose tab
/// approves callers); or refused (a session refusing new callers; a disconnected handle).
pub fn approval_needed<'a>(approvals: &ApprovalState, check: &'a ApprovalCheck) -> Approval<'a> {
    let allowed = |caller: &str| approvals.allowed.iter().any(|(id, _)| id == caller);
    match check {
        ApprovalCheck::Exempt => Approval::Let,
        ApprovalCheck::Ask(caller) | ApprovalCheck::Handle(caller)
            if !approvals.approves || allowed(caller) =>
        {
            Approval::Let
        }
        ApprovalCheck::Handle(_) => Approval::Disconnected,
        ApprovalCheck::Ask(_) if approvals.refused => Approval::Refused,
        ApprovalCheck::Ask(caller) => Approval::Hold(caller),
    }
}

/// The failed answer of a call the relay refused on the person's behalf (declined, not
/// answered in time).
pub fn refused_response(
    id: &str,
    code: toolrelay::errors::ErrorCode,
    message: &str,
) -> ToolResponse {
    ToolResponse {
        request_id: id.to_owned(),
        success: false,
        result: None,
        error: Some(toolrelay::wire::ToolError {
            code: code.as_str().to_owned(),
            message: message.to_owned(),
        }),
        content: None,
        structured_content: None,
    }
}

/// Until when a pushed call is held by its connection: its whole life (another connection of
/// the session claims it all the same, as it is not delivered to *that* one).
pub fn pushed_lease(deadline: Timestamp) -> Timestamp {
    deadline
}

/// The lease a built-in call starts with: held by the relay for [`BUILTIN_LEASE`] until a
/// run takes it.
pub fn builtin_lease(created_at: Timestamp, deadline: Timestamp) -> Timestamp {
    created_at.plus(BUILTIN_LEASE).min(deadline)
}

/// Whether a connection claiming at `now` may be handed `record`: queued, or delivered to
/// another connection, or delivered under a lease that has run out (with `again`, also one
/// delivered to this very connection: a redelivery); never a built-in call, never after its
/// deadline.
pub fn is_claimable(record: &RequestRecord, connection: &str, now: Timestamp, again: bool) -> bool {
    if record.builtin || record.deadline <= now {
        return false;
    }
    match record.status {
        RequestStatus::Queued => true,
        RequestStatus::Delivered => {
            again
                || record.delivered_to.as_deref() != Some(connection)
                || record.lease_until.is_none_or(|lease| lease <= now)
        }
        _ => false,
    }
}

/// Whether a built-in call nobody runs may be taken at `now`: its lease ran out (the replica
/// that ran it, or queued it, is gone).
pub fn is_orphaned_builtin(record: &RequestRecord, now: Timestamp) -> bool {
    record.builtin
        && !record.status.is_terminal()
        && record.deadline > now
        && record.lease_until.is_some_and(|lease| lease <= now)
}

/// Where activity at `now` that keeps the session until `until` moves its expiry
/// `expires_at`: never backwards, never past `max_expires_at`, and only by a step of at least
/// a [`SLIDE_STEP_DIVISOR`]th of the time to live (`None`: it stays).
pub fn slide(
    expires_at: Timestamp,
    max_expires_at: Timestamp,
    now: Timestamp,
    until: Timestamp,
) -> Option<Timestamp> {
    let until = until.min(max_expires_at);
    let step = (until.0 - now.0) / SLIDE_STEP_DIVISOR;
    (until.0 > expires_at.0 && (until.0 - expires_at.0 >= step || until == max_expires_at))
        .then_some(until)
}

/// A rate budget: `limit` units per `period`, all of which may be spent at once (a token
/// bucket, kept as GCRA: one "theoretical arrival time" per key, in microseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateBudget {
    /// Units per period.
    pub limit: NonZeroU32,
    /// The period.
    pub period: Duration,
}

impl RateBudget {
    /// `limit` units a minute.
    pub fn per_minute(limit: NonZeroU32) -> Self {
        Self {
            limit,
            period: Duration::from_secs(60),
        }
    }

    /// Microseconds between two units.
    pub fn interval_micros(self) -> i64 {
        i64::try_from(self.period.as_micros() / u128::from(self.limit.get()))
            .unwrap_or(i64::MAX)
            .max(1)
    }

    /// How far ahead of now the arrival time may run: the whole burst.
    pub fn tolerance_micros(self) -> i64 {
        self.interval_micros()
            .saturating_mul(i64::from(self.limit.get()))
    }

    /// GCRA: with the key's arrival time `tat` (µs), a unit spent at `now` (µs) gives the new
    /// arrival time, or how long to wait.
    pub fn spend(self, tat: i64, now: i64) -> Result<i64, Duration> {
        let next = tat.max(now).saturating_add(self.interval_micros());
        let over = next - now - self.tolerance_micros();
        if over > 0 {
            Err(Duration::from_micros(u64::try_from(over).unwrap_or(0)))
        } else {
            Ok(next)
        }
    }
}

/// The constants above as Lua locals, for the front of every Redis script: the scripts never
/// spell a number of their own.
pub fn lua_preamble() -> String {
    let millis = |duration: Duration| duration.as_millis();
    format!(
        "local BUILTIN_LEASE_MS = {}\n\
         local MAX_FINISHED_PER_SESSION = {MAX_FINISHED_PER_SESSION}\n\
         local ANNOUNCED_ANSWER_BYTES = {ANNOUNCED_ANSWER_BYTES}\n\
         local SLIDE_STEP_DIVISOR = {SLIDE_STEP_DIVISOR}\n\
         local FINISHED_CALL_BYTES = {FINISHED_CALL_BYTES}\n",
        millis(BUILTIN_LEASE),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NewRequest;
    use serde_json::{Value, json};
    use toolrelay::wire::ToolError;

    fn record(
        status: RequestStatus,
        delivered_to: Option<&str>,
        lease: Option<i64>,
    ) -> RequestRecord {
        let mut record = RequestRecord::queued(
            NewRequest {
                id: "r1".into(),
                tool_id: None,
                function_name: "echo".into(),
                args: Value::Null,
                created_at: Timestamp(0),
                deadline: Timestamp(60_000),
                builtin: false,
                correlation_id: None,
                caller: None,
            },
            1,
        );
        record.status = status;
        record.delivered_to = delivered_to.map(str::to_owned);
        record.lease_until = lease.map(Timestamp);
        record
    }

    #[test]
    fn a_queued_call_is_claimable_until_its_deadline() {
        let queued = record(RequestStatus::Queued, None, None);
        assert!(is_claimable(&queued, "c1", Timestamp(59_999), false));
        assert!(!is_claimable(&queued, "c1", Timestamp(60_000), false));
    }

    #[test]
    fn a_delivered_call_goes_to_another_connection_or_after_its_lease() {
        let held = record(RequestStatus::Delivered, Some("c1"), Some(30_000));
        assert!(!is_claimable(&held, "c1", Timestamp(10), false));
        assert!(
            is_claimable(&held, "c1", Timestamp(10), true),
            "a redelivery"
        );
        assert!(is_claimable(&held, "c2", Timestamp(10), false));
        assert!(is_claimable(&held, "c1", Timestamp(30_000), false));
        let finished = record(RequestStatus::Completed, Some("c1"), None);
        assert!(!is_claimable(&finished, "c2", Timestamp(10), true));
    }

    #[test]
    fn built_in_calls_are_never_claimed_and_orphaned_when_their_lease_runs_out() {
        let mut builtin = record(RequestStatus::Delivered, Some("relay"), Some(10_000));
        builtin.builtin = true;
        assert!(!is_claimable(&builtin, "c1", Timestamp(20_000), true));
        assert!(!is_orphaned_builtin(&builtin, Timestamp(9_999)));
        assert!(is_orphaned_builtin(&builtin, Timestamp(10_000)));
        assert!(
            !is_orphaned_builtin(&builtin, Timestamp(60_000)),
            "past its deadline"
        );
        assert_eq!(
            builtin_lease(Timestamp(0), Timestamp(5_000)),
            Timestamp(5_000)
        );
        assert_eq!(
            builtin_lease(Timestamp(0), Timestamp(60_000)),
            Timestamp(10_000)
        );
    }

    #[test]
    fn calls_are_handed_over_to_pushing_connections_only() {
        let provider = |transport| ProviderInfo {
            connection_id: "c1".into(),
            transport,
            connected_at: Timestamp(0),
            last_seen: Timestamp(0),
        };
        for transport in [Transport::WebSocket, Transport::Sse, Transport::Grpc] {
            assert_eq!(hand_over(Some(&provider(transport)), false), Some("c1"));
        }
        assert_eq!(hand_over(Some(&provider(Transport::Polling)), false), None);
        assert_eq!(hand_over(Some(&provider(Transport::WebSocket)), true), None);
        assert_eq!(hand_over(None, false), None);
        assert_eq!(pushed_lease(Timestamp(60_000)), Timestamp(60_000));
    }

    #[test]
    fn an_expiry_moves_forward_by_a_tenth_of_the_time_to_live_at_least() {
        let (max, now) = (Timestamp(1_000_000), Timestamp(100_000));
        // Time to live 600 s: a step under 60 s is not written.
        assert_eq!(
            slide(Timestamp(690_000), max, now, Timestamp(700_000)),
            None
        );
        assert_eq!(
            slide(Timestamp(640_000), max, now, Timestamp(700_000)),
            Some(Timestamp(700_000))
        );
        assert_eq!(
            slide(Timestamp(800_000), max, now, Timestamp(700_000)),
            None,
            "never back"
        );
        // Capped by the maximum lifetime, which it reaches however small the step.
        assert_eq!(
            slide(Timestamp(999_000), max, now, Timestamp(2_000_000)),
            Some(max)
        );
        assert_eq!(slide(max, max, now, Timestamp(2_000_000)), None);
    }

    #[test]
    fn an_answer_costs_its_record_its_id_and_its_json() {
        let small = ToolResponse {
            request_id: "r1".into(),
            success: true,
            result: Some(json!("hello world")),
            error: None,
            content: None,
            structured_content: None,
        };
        let cost = answer_cost(&small);
        assert!(
            cost > FINISHED_CALL_BYTES + 2 && cost < FINISHED_CALL_BYTES + 40,
            "{cost}"
        );
        let failed = ToolResponse {
            request_id: "r1".into(),
            success: false,
            result: None,
            error: Some(ToolError {
                code: "x".into(),
                message: "y".repeat(1000),
            }),
            content: None,
            structured_content: None,
        };
        assert_eq!(answer_cost(&failed), FINISHED_CALL_BYTES + 2 + 1001);
        assert_eq!(share_of(800, ANSWER_SESSION_SHARE), 100);
        assert_eq!(share_of(800, 2.0), 800);
    }

    #[test]
    fn a_rate_budget_allows_its_burst_then_one_unit_per_interval() {
        let budget = RateBudget::per_minute(NonZeroU32::new(60).unwrap());
        assert_eq!(budget.interval_micros(), 1_000_000);
        let mut tat = 0;
        for _ in 0..60 {
            tat = budget.spend(tat, 0).unwrap();
        }
        assert_eq!(budget.spend(tat, 0), Err(Duration::from_secs(1)));
        assert!(budget.spend(tat, 1_000_000).is_ok());
    }

    #[test]
    fn the_lua_preamble_spells_every_constant() {
        let preamble = lua_preamble();
        for line in [
            "local BUILTIN_LEASE_MS = 10000",
            "local MAX_FINISHED_PER_SESSION = 1000",
            "local ANNOUNCED_ANSWER_BYTES = 65536",
            "local SLIDE_STEP_DIVISOR = 10",
            "local FINISHED_CALL_BYTES = 360",
        ] {
            assert!(preamble.contains(line), "{preamble}");
        }
    }
}
