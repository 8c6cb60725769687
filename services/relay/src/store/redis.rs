//! The Redis [`Store`]: state shared by every relay replica (`REDIS_URL`).
//!
//! # Layout
//! Every key starts with a configurable prefix. A session's keys carry its code as a hash tag,
//! `<prefix>{<CODE>}:…`, so a Redis Cluster keeps a session in one slot:
//! `s` (hash: the session), `m` (its manifest JSON), `q` (sorted set: unanswered calls by
//! queue position), `d` (sorted set: their deadlines), `f` (list: finished calls),
//! `a` (sorted set: its kept answers, whose cost the session hash counts: its share of the
//! answer budget), `r:<id>` (hash: one call), and the channel `ev` (its events). Outside sessions:
//! `h:<handle>` (connector handle → code), `answers` + `answer-bytes` (the answer budget),
//! `t:{<scope>}:<id>`, `ts:{<scope>}`, `tickets` + `ticket-bytes` (claim checks and theirs),
//! `sessions` (sorted set: live sessions by expiry) and `unanswered` (sorted set: unanswered
//! calls by deadline) — what the metrics count across replicas, kept by the same scripts that
//! change sessions and calls, so reading them costs a scrape one round trip and a call none.
//!
//! Every change that must not race is one Lua script (`redis.lua` holds their library), so a
//! step such as "queue unless full, and slide the expiry" happens whole or not at all. Redis
//! enforces the TTLs (sessions, finished calls, claim checks), so nothing outlives its session
//! by more than a tenth of its time to live (the slack that spares most calls moving the
//! TTLs of five keys; `slide` in `redis.lua`).
//!
//! # Time
//! Each replica passes its own clock's `now` into every script (clocks agree to milliseconds
//! with NTP, and a skew only moves an expiry by as much); Redis' TTLs follow the same
//! timestamps (`PEXPIREAT`).
//!
//! # Events
//! Scripts `PUBLISH` a session's changes on its channel. Each replica holds one pub/sub
//! connection and fans messages out to its local subscribers ([`EventHub`]). The contract a
//! reader relies on: subscribe before reading state; after a reconnect every subscriber gets
//! [`SessionEvent::Missed`] (look again); a Redis error never ends a stream; and every stream
//! also gets `Missed` every [`SAFETY_NET`], so a lost message delays a call by at most that.
//!
//! # Cluster
//! The tested topology is one primary (with AOF). Scripts touch only their session's slot,
//! except the answer budget (`answers`, `answer-bytes`), evicting another session's answer,
//! and the metrics' `sessions` and `unanswered`, which cross slots: on a Cluster those would
//! need to be kept per slot (and summed when read).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncCommands, Script};
use serde_json::Value;
use toolrelay::wire::{RequestStatus, ToolResponse};

use super::events::SessionChannel;
use super::memory::{
    MAX_TICKETS_PER_SCOPE, StoreLimits, TICKET_OVERHEAD, pack_ticket, unpack_ticket,
};
use super::{
    Answerer, Claim, EnqueueChecks, Enqueued, EventStream, Finished, McpSessionCaps,
    McpSessionsFull, NewRequest, ProviderInfo, RateBudget, RequestRecord, SessionEvent,
    SessionRecord, Store, StoreUsage, Transport,
};
use crate::clock::{Clock, Timestamp};
use crate::code::SessionCode;
use crate::error::StoreError;
use crate::metrics::Metrics;

/// How often every event stream also says [`SessionEvent::Missed`]: the longest a lost
/// message can delay a call.
pub const SAFETY_NET: Duration = Duration::from_secs(2);
/// Finished calls whose answer is at most this many bytes are announced whole on the
/// session's channel, so a waiting caller need not read them (`redis.lua` spells it too).
pub const ANNOUNCED_ANSWER_BYTES: usize = 64 * 1024;
/// How long a command may take before the store counts as unreachable.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the event connection is pinged, to notice a Redis that went away silently.
const HEARTBEAT: Duration = Duration::from_secs(5);

const LIBRARY: &str = include_str!("redis.lua");

/// Also forgets a few sessions that expired meanwhile (see `sweep_expired`), so that the set
/// of sessions stays as large as the live ones even if nothing reads the metrics.
const INSERT: &str = r"
local existing = session_field('expires_at')
if existing and tonumber(existing) > now then return 0 end
if existing then end_session(true) end
redis.call('HSET', S, 'code', ARGV[5], 'token_hash', ARGV[6], 'created_at', ARGV[7],
  'expires_at', ARGV[8], 'max_expires_at', ARGV[9], 'mcp_handle', ARGV[10],
  'manifest_revision', 0, 'next_seq', 0)
redis.call('PEXPIREAT', S, ARGV[8])
redis.call('SET', KEYS[2], ARGV[5], 'PXAT', ARGV[9])
redis.call('ZADD', SESSIONS, ARGV[8], ARGV[5])
sweep_expired(10)
return 1
";

const SESSION: &str = r"
if not live() then return false end
return redis.call('HGETALL', S)
";

const TOUCH: &str = r"
if not live() then return false end
if ARGV[6] ~= '' then
  if session_field('p_conn') ~= ARGV[6] then return redis.call('HGETALL', S) end
  redis.call('HSET', S, 'p_last_seen', now)
end
slide(tonumber(ARGV[5]))
return redis.call('HGETALL', S)
";

const DELETE: &str = r"
local was = live()
if redis.call('EXISTS', S) == 1 then end_session(false) end
if was then return 1 end
return 0
";

const SET_PROVIDER: &str = r"
if not live() then return false end
redis.call('HSET', S, 'p_conn', ARGV[5], 'p_transport', ARGV[6], 'p_connected_at', ARGV[7],
  'p_last_seen', ARGV[8])
redis.call('PUBLISH', base .. 'ev', 'p:' .. ARGV[5])
return redis.call('HGETALL', S)
";

const CLEAR_PROVIDER: &str = r"
if live() and session_field('p_conn') == ARGV[5] then
  redis.call('HDEL', S, 'p_conn', 'p_transport', 'p_connected_at', 'p_last_seen')
end
return 1
";

const SET_MANIFEST: &str = r"
if not live() then return false end
redis.call('SET', base .. 'm', ARGV[5])
keep('m')
local revision = redis.call('HINCRBY', S, 'manifest_revision', 1)
redis.call('PUBLISH', base .. 'ev', 'm')
return revision
";

const MANIFEST: &str = r"
if not live() then return false end
return { session_field('manifest_revision'), redis.call('GET', base .. 'm') or '' }
";

/// KEYS[2] (optional) a rate budget to spend first. ARGV[5..] id, tool id, function, args,
/// created at, deadline, built-in, correlation id, call hash, max pending, until, the manifest
/// revision required ('' for any), the budget's interval and tolerance (µs). Answers
/// { outcome, the call or false, the session }.
const ENQUEUE: &str = r"
if KEYS[2] then
  local over = gcra(KEYS[2], now * 1000, tonumber(ARGV[17]), tonumber(ARGV[18]))
  if over > 0 then return { 'limited', false, false, over } end
end
if not live() then return { 'nosession' } end
expire_due()
local function answer(outcome, r)
  return { outcome, r and redis.call('HGETALL', r) or false, redis.call('HGETALL', S) }
end
if ARGV[16] ~= '' and (session_field('manifest_revision') or '0') ~= ARGV[16] then
  return answer('stale')
end
local id = ARGV[5]
local r = base .. 'r:' .. id
if redis.call('EXISTS', r) == 1 then
  if redis.call('HGET', r, 'call_hash') == ARGV[13] then return answer('existing', r) end
  return answer('conflict')
end
local pending = redis.call('ZCARD', base .. 'q')
if pending >= tonumber(ARGV[14]) then return answer('full') end
local seq = redis.call('HINCRBY', S, 'next_seq', 1)
local builtin = ARGV[11] == '1'
-- A built-in call is held by 'relay' (not yet taken by a run) for BUILTIN_LEASE (10 s).
local lease_until = string.format('%.0f', math.min(tonumber(ARGV[10]), tonumber(ARGV[9]) + 10000))
redis.call('HSET', r, 'id', id, 'seq', seq, 'tool_id', ARGV[6], 'function', ARGV[7],
  'args', ARGV[8], 'status', builtin and 'delivered' or 'queued', 'created_at', ARGV[9],
  'deadline', ARGV[10], 'delivered_to', builtin and 'relay' or '',
  'lease_until', builtin and lease_until or '', 'deliveries', builtin and 1 or 0,
  'response', '', 'finished_at', '', 'builtin', ARGV[11], 'correlation_id', ARGV[12],
  'call_hash', ARGV[13], 'evicted', '0')
redis.call('PEXPIREAT', r, session_field('max_expires_at'))
redis.call('ZADD', base .. 'q', seq, id)
redis.call('ZADD', base .. 'd', ARGV[10], id)
redis.call('ZADD', UNANSWERED, ARGV[10], unanswered_member(id))
-- The queue and its deadlines (which hold the same calls) were just created: give them a TTL.
if pending == 0 then
  keep('q')
  keep('d')
end
slide(tonumber(ARGV[15]))
redis.call('PUBLISH', base .. 'ev', 'q')
return answer('queued', r)
";

const REQUEST: &str = r"
if not live() then return { 'nosession' } end
expire_due()
local r = base .. 'r:' .. ARGV[5]
if redis.call('EXISTS', r) == 0 then return { 'norequest' } end
return { 'found', redis.call('HGETALL', r) }
";

const RESPONSES: &str = r"
if not live() then return false end
expire_due()
local out = {}
for _, id in ipairs(redis.call('LRANGE', base .. 'f', 0, -1)) do
  local r = base .. 'r:' .. id
  if redis.call('EXISTS', r) == 1 then table.insert(out, redis.call('HGETALL', r)) end
end
return out
";

const PENDING: &str = r"
if not live() then return false end
expire_due()
return redis.call('ZCARD', base .. 'q')
";

/// ARGV[5..] connection, lease until, most calls, `1` to redeliver (see [`Claim::redeliver`]).
const CLAIM: &str = r"
if not live() then return {} end
expire_due()
if session_field('p_conn') ~= ARGV[5] then return {} end
local out = {}
local limit = tonumber(ARGV[7])
for _, id in ipairs(redis.call('ZRANGE', base .. 'q', 0, -1)) do
  if #out >= limit then break end
  local r = base .. 'r:' .. id
  local h = redis.call('HMGET', r, 'status', 'delivered_to', 'lease_until', 'deadline', 'builtin',
    'deliveries')
  local claimable = h[4] and h[5] ~= '1' and tonumber(h[4]) > now and (h[1] == 'queued'
    or (h[1] == 'delivered' and (h[2] ~= ARGV[5] or h[3] == '' or tonumber(h[3]) <= now
      or ARGV[8] == '1')))
  if claimable then
    redis.call('HSET', r, 'status', 'delivered', 'delivered_to', ARGV[5], 'lease_until', ARGV[6],
      'deliveries', tonumber(h[6] or '0') + 1)
    table.insert(out, redis.call('HGETALL', r))
  end
end
return out
";

/// ARGV[5..] id, holder, lease until.
const LEASE_BUILTIN: &str = r"
if not live() then return false end
expire_due()
local r = base .. 'r:' .. ARGV[5]
local h = redis.call('HMGET', r, 'status', 'delivered_to', 'lease_until', 'deadline', 'builtin')
if h[5] ~= '1' or not h[4] or tonumber(h[4]) <= now then return false end
local renewal = h[2] == ARGV[6]
local unstarted = h[2] == 'relay'
local free = h[1] == 'queued' or (h[1] == 'delivered'
  and (renewal or unstarted or h[3] == '' or tonumber(h[3]) <= now))
if not free then return false end
redis.call('HSET', r, 'status', 'delivered', 'delivered_to', ARGV[6], 'lease_until', ARGV[7])
-- A run after the first (counted when the call was queued) is a takeover.
if not renewal and not unstarted then redis.call('HINCRBY', r, 'deliveries', 1) end
return redis.call('HGETALL', r)
";

/// ARGV[5..] id, status, answer, until, who answers (`relay`, `connection` or `provider`, as
/// [`Answerer`]), the answering connection, the session's share of the answer budget (bytes).
const FINISH: &str = r"
if not live() then return { 'nosession' } end
expire_due()
local r = base .. 'r:' .. ARGV[5]
local h = redis.call('HMGET', r, 'status', 'builtin', 'delivered_to')
local status = h[1]
if not status then return { 'norequest' } end
if ARGV[9] ~= 'relay' then
  local answerer = ARGV[10]
  if ARGV[9] == 'provider' then answerer = session_field('p_conn') or '' end
  if h[2] == '1' or answerer == '' or h[3] ~= answerer then return { 'notdelivered' } end
end
if status ~= 'queued' and status ~= 'delivered' then
  return { 'already', redis.call('HGETALL', r) }
end
local finished = finish_record(ARGV[5], ARGV[6], ARGV[7])
keep_share(tonumber(ARGV[11]))
keep_within()
slide(tonumber(ARGV[8]))
return { 'finished', finished }
";

/// Claim checks: KEYS ticket, scope set, all tickets, their bytes. ARGV now, value,
/// expires_at, cost, member, scope, max per scope, budget, ticket key prefix, scope set prefix.
const PUT_TICKET: &str = r"
local t, ts, all, bytes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = tonumber(ARGV[1])
local function drop(member)
  local id, cost, scope = string.match(member, '^(.-)\n(%d+)\n(.*)$')
  if redis.call('ZREM', all, member) == 1 then redis.call('DECRBY', bytes, cost) end
  redis.call('DEL', ARGV[9] .. '{' .. scope .. '}:' .. id)
  redis.call('ZREM', ARGV[10] .. '{' .. scope .. '}', id)
end
for _, member in ipairs(redis.call('ZRANGEBYSCORE', all, '-inf', now, 'LIMIT', 0, 100)) do
  drop(member)
end
local previous = redis.call('HGET', t, 'member')
if previous then drop(previous) end
while redis.call('ZCARD', ts) >= tonumber(ARGV[7]) do
  local oldest = redis.call('ZRANGE', ts, 0, 0)[1]
  local member = redis.call('HGET', ARGV[9] .. '{' .. ARGV[6] .. '}:' .. oldest, 'member')
  if member then drop(member) else redis.call('ZREM', ts, oldest) end
end
local rounds = 0
while tonumber(redis.call('GET', bytes) or '0') + tonumber(ARGV[4]) > tonumber(ARGV[8])
    and rounds < 10000 do
  local popped = redis.call('ZRANGE', all, 0, 0)
  if #popped == 0 then break end
  drop(popped[1])
  rounds = rounds + 1
end
redis.call('HSET', t, 'v', ARGV[2], 'expires_at', ARGV[3], 'member', ARGV[5])
redis.call('PEXPIREAT', t, ARGV[3])
redis.call('ZADD', ts, ARGV[3], string.match(ARGV[5], '^(.-)\n'))
redis.call('PEXPIREAT', ts, ARGV[3])
redis.call('ZADD', all, ARGV[3], ARGV[5])
redis.call('INCRBY', bytes, ARGV[4])
return 1
";

/// A rate budget, GCRA as [`RateBudget::spend`]: KEYS its arrival time (µs). ARGV now (µs),
/// interval (µs), tolerance (µs). Answers 0 when spent, else the µs to wait.
/// Takes lock KEYS[1] for ARGV[1] until ARGV[2] (ms), or renews it for its holder.
const LOCK: &str = r"
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2])
return 1
";

/// Releases lock KEYS[1] if ARGV[1] holds it.
const UNLOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
";

/// What the metrics read: KEYS the sessions by expiry, the unanswered calls by deadline, the
/// answers' and the claim checks' bytes; ARGV now, most expired sessions to forget. Answers
/// { sessions it forgot (they expired), sessions alive, calls waiting, answer bytes, ticket
/// bytes }.
const USAGE: &str = r"
local now = tonumber(ARGV[1])
local forgot = 0
for _, code in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))) do
  forgot = forgot + redis.call('ZREM', KEYS[1], code)
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
return { forgot, redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf'),
  redis.call('ZCOUNT', KEYS[2], '(' .. now, '+inf'),
  tonumber(redis.call('GET', KEYS[3]) or '0'), tonumber(redis.call('GET', KEYS[4]) or '0') }
";

/// MCP client sessions. Each is kept at `<prefix>mcp:<id>` as "expires_at\naddress\nstate"
/// (Redis drops it by its own clock, the replica's clock decides, as for every other
/// deadline) and counted by its expiry in `<prefix>mcp-live` (every client) and
/// `<prefix>mcp-live:<address>` (one client), where a place opened for a session that has not
/// answered its `initialize` yet is counted too. Each script's KEYS[1] is the first set, ARGV[1]
/// the prefix, ARGV[2] now (ms).
const MCP_LIBRARY: &str = r"
local live, prefix, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local function drop_expired(set)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
end
local function count(member, address, expires_at)
  redis.call('ZADD', live, expires_at, member)
  local mine = live .. ':' .. address
  redis.call('ZADD', mine, expires_at, member)
  redis.call('PEXPIREAT', mine, expires_at, 'GT')
  if redis.call('PTTL', mine) < 0 then redis.call('PEXPIREAT', mine, expires_at) end
end
local function uncount(member, address)
  redis.call('ZREM', live, member)
  redis.call('ZREM', live .. ':' .. address, member)
end
local function kept(id)
  local text = redis.call('GET', prefix .. 'mcp:' .. id)
  if not text then return nil end
  local expires_at, address, state = string.match(text, '^(%d+)\n([^\n]*)\n(.*)$')
  return tonumber(expires_at), address, state
end
";

/// Opens place ARGV[3] for client ARGV[4] until ARGV[5], unless it holds ARGV[6] places or
/// everyone ARGV[7]: 0, or 1 (the client's cap) or 2 (the total).
const OPEN_MCP: &str = r"
local slot, address, expires_at = ARGV[3], ARGV[4], ARGV[5]
local mine = live .. ':' .. address
drop_expired(mine)
if redis.call('ZCARD', mine) >= tonumber(ARGV[6]) then return 1 end
drop_expired(live)
if redis.call('ZCARD', live) >= tonumber(ARGV[7]) then return 2 end
count(slot, address, expires_at)
return 0
";

/// Keeps session ARGV[3] in place ARGV[4] of client ARGV[5] until ARGV[6], its state ARGV[7].
const PUT_MCP: &str = r"
local id, slot, address, expires_at = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
uncount(slot, address)
count(id, address, expires_at)
redis.call('SET', prefix .. 'mcp:' .. id, expires_at .. '\n' .. address .. '\n' .. ARGV[7], 'PXAT', expires_at)
return 0
";

/// Moves session ARGV[3]'s expiry to ARGV[4]: 1 if kept, else 0.
const TOUCH_MCP: &str = r"
local id, expires_at = ARGV[3], ARGV[4]
local was, address, state = kept(id)
if not was or was <= now then return 0 end
redis.call('SET', prefix .. 'mcp:' .. id, expires_at .. '\n' .. address .. '\n' .. state, 'PXAT', expires_at)
count(id, address, expires_at)
return 1
";

/// Forgets session (or place) ARGV[3].
const DELETE_MCP: &str = r"
local id = ARGV[3]
local _, address = kept(id)
redis.call('DEL', prefix .. 'mcp:' .. id)
redis.call('ZREM', live, id)
if address then redis.call('ZREM', live .. ':' .. address, id) end
return 0
";

/// Expired sessions a read of the metrics forgets at most (the rest at the next).
const USAGE_SWEEP: usize = 1000;

/// A rate budget: KEYS[1] its theoretical arrival time; ARGV now, interval, tolerance (µs).
const SPEND: &str = r"
return gcra(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]))
";

/// GCRA (see [`RateBudget`]): spends a unit of the budget whose theoretical arrival time is
/// kept at `key`; 0 when it was there, else the µs until it is.
const GCRA: &str = r"
local function gcra(key, now_us, interval, tolerance)
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now_us)
  local next = tat + interval
  local over = next - now_us - tolerance
  if over > 0 then return over end
  redis.call('SET', key, string.format('%.0f', next), 'PX', math.ceil((next - now_us) / 1000) + 1)
  return 0
end
";

/// The scripts, each with the library in front.
struct Scripts {
    insert: Script,
    session: Script,
    touch: Script,
    delete: Script,
    set_provider: Script,
    clear_provider: Script,
    set_manifest: Script,
    manifest: Script,
    enqueue: Script,
    request: Script,
    responses: Script,
    pending: Script,
    claim: Script,
    lease_builtin: Script,
    finish: Script,
    put_ticket: Script,
    spend: Script,
    lock: Script,
    unlock: Script,
    usage: Script,
    open_mcp: Script,
    put_mcp: Script,
    touch_mcp: Script,
    delete_mcp: Script,
}

impl Scripts {
    fn new() -> Self {
        // Each body runs as a function, so that its answer can go out with what the script
        // expired (see `run`).
        let with_library = |body: &str| {
            Script::new(&format!(
                "{LIBRARY}\nlocal function body()\n{body}\nend\nlocal answered = body()\nreturn {{ expired_calls, expired_sessions, answered }}"
            ))
        };
        Self {
            insert: with_library(INSERT),
            session: with_library(SESSION),
            touch: with_library(TOUCH),
            delete: with_library(DELETE),
            set_provider: with_library(SET_PROVIDER),
            clear_provider: with_library(CLEAR_PROVIDER),
            set_manifest: with_library(SET_MANIFEST),
            manifest: with_library(MANIFEST),
            enqueue: with_library(&format!("{GCRA}\n{ENQUEUE}")),
            request: with_library(REQUEST),
            responses: with_library(RESPONSES),
            pending: with_library(PENDING),
            claim: with_library(CLAIM),
            lease_builtin: with_library(LEASE_BUILTIN),
            finish: with_library(FINISH),
            put_ticket: Script::new(PUT_TICKET),
            spend: Script::new(&format!("{GCRA}\n{SPEND}")),
            lock: Script::new(LOCK),
            unlock: Script::new(UNLOCK),
            usage: Script::new(USAGE),
            open_mcp: Script::new(&format!("{MCP_LIBRARY}\n{OPEN_MCP}")),
            put_mcp: Script::new(&format!("{MCP_LIBRARY}\n{PUT_MCP}")),
            touch_mcp: Script::new(&format!("{MCP_LIBRARY}\n{TOUCH_MCP}")),
            delete_mcp: Script::new(&format!("{MCP_LIBRARY}\n{DELETE_MCP}")),
        }
    }
}

/// Sessions, calls and claim checks in Redis, shared by every replica.
pub struct RedisStore {
    redis: ConnectionManager,
    prefix: String,
    clock: Clock,
    limits: StoreLimits,
    ticket_budget: usize,
    events: Arc<EventHub>,
    scripts: Scripts,
    /// Where the sessions and calls its scripts expire are counted.
    metrics: Metrics,
}

impl RedisStore {
    /// A store on the Redis at `url`, its keys under `prefix`, counting the sessions and
    /// calls it expires into `metrics`. Waits (retrying, and saying so in the log) until
    /// Redis answers, so a replica started before its Redis comes up rather than
    /// crash-looping.
    pub async fn connect(
        url: &str,
        prefix: &str,
        clock: Clock,
        limits: StoreLimits,
        metrics: Metrics,
    ) -> Result<Arc<Self>, StoreError> {
        let unusable = |error: redis::RedisError| {
            StoreError(format!("REDIS_URL {url:?} is not usable: {error}"))
        };
        // Nagle's algorithm off (the crate leaves it on): every store operation is a small
        // write that would otherwise wait for the peer's delayed ACK.
        let info = redis::IntoConnectionInfo::into_connection_info(url)
            .map_err(unusable)?
            .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
        let client = redis::Client::open(info).map_err(unusable)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(RESPONSE_TIMEOUT))
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let mut delay = Duration::from_millis(200);
        let redis = loop {
            match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
                Ok(redis) => break redis,
                Err(error) => {
                    tracing::warn!(%error, retry_in_ms = delay.as_millis() as u64, "Redis is not reachable yet; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        };
        let events = EventHub::start(client);
        Ok(Arc::new(Self {
            redis,
            prefix: prefix.to_owned(),
            clock,
            ticket_budget: limits.ticket_budget,
            limits,
            events,
            scripts: Scripts::new(),
            metrics,
        }))
    }

    fn base(&self, code: &SessionCode) -> String {
        format!("{}{{{}}}:", self.prefix, code.as_str())
    }

    /// The key of rate budget `key`.
    /// An MCP session script with its common keys and arguments (see [`MCP_LIBRARY`]).
    fn mcp_script<'a>(&self, script: &'a Script) -> redis::ScriptInvocation<'a> {
        let mut invocation = script.key(format!("{}mcp-live", self.prefix));
        invocation.arg(&self.prefix).arg(self.clock.now().0);
        invocation
    }

    fn rate_key(&self, key: &str) -> String {
        format!("{}rate:{key}", self.prefix)
    }

    /// Runs a session script: the common arguments, then `args`. Counts what it expired.
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        code: &SessionCode,
        extra_keys: &[String],
        args: &[String],
    ) -> Result<T, StoreError> {
        let mut invocation = script.key(self.base(code));
        for key in extra_keys {
            invocation.key(key);
        }
        invocation
            .arg(self.clock.now().0)
            .arg(&self.prefix)
            .arg(millis(self.limits.retention))
            .arg(self.limits.answer_budget);
        for arg in args {
            invocation.arg(arg);
        }
        let mut redis = self.redis.clone();
        let answer: redis::Value = invocation
            .invoke_async(&mut redis)
            .await
            .map_err(store_error)?;
        let (calls, sessions, answer) = counted(answer)?;
        self.metrics.calls_expired(calls);
        self.metrics.sessions_expired(sessions);
        T::from_redis_value(answer).map_err(unreadable)
    }
}

/// A session script's `{ expired calls, expired sessions, answer }`.
fn counted(answer: redis::Value) -> Result<(u64, u64, redis::Value), StoreError> {
    let redis::Value::Array(items) = answer else {
        return Err(missing("count of what the script expired"));
    };
    let mut items = items.into_iter();
    let mut count = || match items.next() {
        Some(redis::Value::Int(count)) => Ok(count.unsigned_abs()),
        _ => Err(missing("count of what the script expired")),
    };
    let (calls, sessions) = (count()?, count()?);
    // A script answering nothing (nil) leaves the third place empty.
    Ok((calls, sessions, items.next().unwrap_or(redis::Value::Nil)))
}

fn unreadable(error: redis::ParsingError) -> StoreError {
    StoreError(format!("an unreadable answer from Redis: {error}"))
}

fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "Redis did not answer in time",
    ))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn store_error(error: redis::RedisError) -> StoreError {
    StoreError(format!("Redis: {error}"))
}

/// A flat `HGETALL` answer as a map.
fn fields(flat: Vec<String>) -> HashMap<String, String> {
    let mut map = HashMap::with_capacity(flat.len() / 2);
    let mut items = flat.into_iter();
    while let (Some(key), Some(value)) = (items.next(), items.next()) {
        map.insert(key, value);
    }
    map
}

fn number(map: &HashMap<String, String>, key: &str) -> i64 {
    map.get(key)
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

fn text(map: &HashMap<String, String>, key: &str) -> Option<String> {
    map.get(key).filter(|value| !value.is_empty()).cloned()
}

fn session_record(map: &HashMap<String, String>) -> Result<SessionRecord, StoreError> {
    let code = map
        .get("code")
        .and_then(|code| SessionCode::parse(code).ok())
        .ok_or_else(|| StoreError("a stored session has no code".into()))?;
    let provider = text(map, "p_conn").map(|connection_id| ProviderInfo {
        connection_id,
        transport: map
            .get("p_transport")
            .and_then(|name| Transport::parse(name))
            .unwrap_or(Transport::WebSocket),
        connected_at: Timestamp(number(map, "p_connected_at")),
        last_seen: Timestamp(number(map, "p_last_seen")),
    });
    Ok(SessionRecord {
        code,
        token_hash: map.get("token_hash").cloned().unwrap_or_default(),
        created_at: Timestamp(number(map, "created_at")),
        expires_at: Timestamp(number(map, "expires_at")),
        max_expires_at: Timestamp(number(map, "max_expires_at")),
        provider,
        manifest_revision: u64::try_from(number(map, "manifest_revision")).unwrap_or(0),
        mcp_handle: map.get("mcp_handle").cloned().unwrap_or_default(),
    })
}

fn status_of(name: &str) -> RequestStatus {
    match name {
        "delivered" => RequestStatus::Delivered,
        "completed" => RequestStatus::Completed,
        "failed" => RequestStatus::Failed,
        "expired" => RequestStatus::Expired,
        _ => RequestStatus::Queued,
    }
}

fn request_record(map: &HashMap<String, String>) -> Result<RequestRecord, StoreError> {
    let corrupt = |what: &str| StoreError(format!("a stored call's {what} is unreadable"));
    let args = match map.get("args").filter(|args| !args.is_empty()) {
        Some(args) => serde_json::from_str(args).map_err(|_| corrupt("arguments"))?,
        None => Value::Null,
    };
    let status = status_of(map.get("status").map_or("", String::as_str));
    let finished_at = map
        .get("finished_at")
        .filter(|at| !at.is_empty())
        .and_then(|at| at.parse().ok())
        .map(Timestamp);
    let mut record = RequestRecord {
        id: map.get("id").cloned().unwrap_or_default(),
        seq: u64::try_from(number(map, "seq")).unwrap_or(0),
        tool_id: text(map, "tool_id"),
        function_name: map.get("function").cloned().unwrap_or_default(),
        args,
        status,
        created_at: Timestamp(number(map, "created_at")),
        deadline: Timestamp(number(map, "deadline")),
        delivered_to: text(map, "delivered_to"),
        lease_until: map
            .get("lease_until")
            .filter(|at| !at.is_empty())
            .and_then(|at| at.parse().ok())
            .map(Timestamp),
        deliveries: u32::try_from(number(map, "deliveries")).unwrap_or(0),
        response: None,
        finished_at,
        builtin: map.get("builtin").is_some_and(|flag| flag == "1"),
        correlation_id: text(map, "correlation_id"),
        call_hash: map.get("call_hash").cloned().unwrap_or_default(),
        evicted: map.get("evicted").is_some_and(|flag| flag == "1"),
    };
    record.response = match map.get("response").filter(|response| !response.is_empty()) {
        Some(response) => Some(serde_json::from_str(response).map_err(|_| corrupt("answer"))?),
        // An expired call's answer is built here, where its message is written.
        None if status == RequestStatus::Expired && !record.evicted => {
            Some(record.expired_response())
        }
        None => None,
    };
    Ok(record)
}

/// A script's `{tag, record}` answer.
fn tagged(answer: redis::Value) -> Result<(String, Option<RequestRecord>), StoreError> {
    let (tag, rest): (String, Vec<redis::Value>) = match answer {
        redis::Value::Array(mut items) if !items.is_empty() => {
            let tag = redis::from_redis_value(items.remove(0)).map_err(unreadable)?;
            (tag, items)
        }
        other => {
            return Err(StoreError(format!(
                "an unexpected answer from Redis: {other:?}"
            )));
        }
    };
    let record = match rest.into_iter().next() {
        Some(value) => {
            let flat: Vec<String> = redis::from_redis_value(value).map_err(unreadable)?;
            Some(request_record(&fields(flat))?)
        }
        None => None,
    };
    Ok((tag, record))
}

fn missing(what: &str) -> StoreError {
    StoreError(format!("Redis answered without the {what}"))
}

#[async_trait]
impl Store for RedisStore {
    async fn insert_session(&self, session: SessionRecord) -> Result<bool, StoreError> {
        let handle = format!("{}h:{}", self.prefix, session.mcp_handle);
        let inserted: i64 = self
            .run(
                &self.scripts.insert,
                &session.code,
                &[handle],
                &[
                    session.code.as_str().to_owned(),
                    session.token_hash.clone(),
                    session.created_at.0.to_string(),
                    session.expires_at.0.to_string(),
                    session.max_expires_at.0.to_string(),
                    session.mcp_handle.clone(),
                ],
            )
            .await?;
        Ok(inserted == 1)
    }

    async fn session(&self, code: &SessionCode) -> Result<Option<SessionRecord>, StoreError> {
        let flat: Option<Vec<String>> = self.run(&self.scripts.session, code, &[], &[]).await?;
        flat.map(|flat| session_record(&fields(flat))).transpose()
    }

    async fn session_by_handle(&self, handle: &str) -> Result<Option<SessionCode>, StoreError> {
        let mut redis = self.redis.clone();
        let code: Option<String> = redis
            .get(format!("{}h:{handle}", self.prefix))
            .await
            .map_err(store_error)?;
        let Some(code) = code.and_then(|code| SessionCode::parse(&code).ok()) else {
            return Ok(None);
        };
        let owns = self
            .session(&code)
            .await?
            .is_some_and(|session| session.mcp_handle == handle);
        Ok(owns.then_some(code))
    }

    async fn touch_session(
        &self,
        code: &SessionCode,
        _now: Timestamp, // the scripts take `now` from the clock, as every script does
        until: Timestamp,
        seen: Option<&str>,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let flat: Option<Vec<String>> = self
            .run(
                &self.scripts.touch,
                code,
                &[],
                &[until.0.to_string(), seen.unwrap_or_default().to_owned()],
            )
            .await?;
        flat.map(|flat| session_record(&fields(flat))).transpose()
    }

    async fn delete_session(&self, code: &SessionCode) -> Result<bool, StoreError> {
        let deleted: i64 = self.run(&self.scripts.delete, code, &[], &[]).await?;
        Ok(deleted == 1)
    }

    async fn set_provider(
        &self,
        code: &SessionCode,
        provider: ProviderInfo,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let flat: Option<Vec<String>> = self
            .run(
                &self.scripts.set_provider,
                code,
                &[],
                &[
                    provider.connection_id,
                    provider.transport.as_str().to_owned(),
                    provider.connected_at.0.to_string(),
                    provider.last_seen.0.to_string(),
                ],
            )
            .await?;
        flat.map(|flat| session_record(&fields(flat))).transpose()
    }

    async fn clear_provider(
        &self,
        code: &SessionCode,
        connection_id: &str,
    ) -> Result<(), StoreError> {
        let _: i64 = self
            .run(
                &self.scripts.clear_provider,
                code,
                &[],
                &[connection_id.to_owned()],
            )
            .await?;
        Ok(())
    }

    async fn set_manifest(
        &self,
        code: &SessionCode,
        json: String,
    ) -> Result<Option<u64>, StoreError> {
        self.run(&self.scripts.set_manifest, code, &[], &[json])
            .await
    }

    async fn manifest(
        &self,
        code: &SessionCode,
    ) -> Result<Option<(u64, Option<String>)>, StoreError> {
        let found: Option<(u64, String)> = self.run(&self.scripts.manifest, code, &[], &[]).await?;
        Ok(found.map(|(revision, json)| (revision, (!json.is_empty()).then_some(json))))
    }

    async fn enqueue_checked(
        &self,
        code: &SessionCode,
        request: &NewRequest,
        max_pending: usize,
        until: Timestamp,
        checks: EnqueueChecks,
    ) -> Result<(Enqueued, Option<SessionRecord>), StoreError> {
        let call_hash = super::call_hash(
            request.tool_id.as_deref(),
            &request.function_name,
            &request.args,
        );
        let (rate_key, interval, tolerance) = match &checks.charge {
            Some(charge) => (
                vec![self.rate_key(&charge.key)],
                charge.budget.interval_micros().to_string(),
                charge.budget.tolerance_micros().to_string(),
            ),
            None => (Vec::new(), String::new(), String::new()),
        };
        let answer: redis::Value = self
            .run(
                &self.scripts.enqueue,
                code,
                &rate_key,
                &[
                    request.id.clone(),
                    request.tool_id.clone().unwrap_or_default(),
                    request.function_name.clone(),
                    request.args.to_string(),
                    request.created_at.0.to_string(),
                    request.deadline.0.to_string(),
                    if request.builtin { "1" } else { "0" }.to_owned(),
                    request.correlation_id.clone().unwrap_or_default(),
                    call_hash,
                    max_pending.to_string(),
                    until.0.to_string(),
                    checks
                        .manifest_revision
                        .map_or_else(String::new, |revision| revision.to_string()),
                    interval,
                    tolerance,
                ],
            )
            .await?;
        let redis::Value::Array(items) = answer else {
            return Err(StoreError(format!(
                "an unexpected answer from Redis: {answer:?}"
            )));
        };
        let mut items = items.into_iter();
        let outcome: String = items
            .next()
            .map(redis::from_redis_value)
            .transpose()
            .map_err(unreadable)?
            .unwrap_or_default();
        let hash =
            |value: Option<redis::Value>| -> Result<Option<HashMap<String, String>>, StoreError> {
                match value {
                    None | Some(redis::Value::Nil | redis::Value::Boolean(false)) => Ok(None),
                    Some(value) => Ok(Some(fields(
                        redis::from_redis_value(value).map_err(unreadable)?,
                    ))),
                }
            };
        let record = hash(items.next())?
            .map(|map| request_record(&map))
            .transpose()?;
        let session = hash(items.next())?
            .map(|map| session_record(&map))
            .transpose()?;
        let call = || record.clone().ok_or_else(|| missing("call"));
        let enqueued = match outcome.as_str() {
            "queued" => Enqueued::Queued(call()?),
            "existing" => Enqueued::Existing(call()?),
            "conflict" => Enqueued::Conflict,
            "full" => Enqueued::Full,
            "stale" => Enqueued::StaleManifest,
            "limited" => {
                let over: i64 = items
                    .next()
                    .map(redis::from_redis_value)
                    .transpose()
                    .map_err(unreadable)?
                    .unwrap_or(1);
                Enqueued::RateLimited(Duration::from_micros(over.unsigned_abs()))
            }
            _ => Enqueued::NoSession,
        };
        Ok((enqueued, session))
    }

    async fn request(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<Option<RequestRecord>, StoreError> {
        let answer: redis::Value = self
            .run(&self.scripts.request, code, &[], &[id.to_owned()])
            .await?;
        Ok(tagged(answer)?.1)
    }

    async fn responses(&self, code: &SessionCode) -> Result<Option<Vec<ToolResponse>>, StoreError> {
        let found: Option<Vec<Vec<String>>> =
            self.run(&self.scripts.responses, code, &[], &[]).await?;
        let Some(found) = found else { return Ok(None) };
        let mut records = found
            .into_iter()
            .map(|flat| request_record(&fields(flat)))
            .collect::<Result<Vec<_>, _>>()?;
        records.sort_by_key(|record| record.seq);
        Ok(Some(
            records
                .into_iter()
                .filter_map(|record| record.response)
                .collect(),
        ))
    }

    async fn pending_count(&self, code: &SessionCode) -> Result<Option<usize>, StoreError> {
        self.run(&self.scripts.pending, code, &[], &[]).await
    }

    async fn lease_builtin(
        &self,
        code: &SessionCode,
        id: &str,
        holder: &str,
        _now: Timestamp,
        until: Timestamp,
    ) -> Result<Option<RequestRecord>, StoreError> {
        let found: Option<Vec<String>> = self
            .run(
                &self.scripts.lease_builtin,
                code,
                &[],
                &[id.to_owned(), holder.to_owned(), until.0.to_string()],
            )
            .await?;
        found.map(|flat| request_record(&fields(flat))).transpose()
    }

    async fn claim(
        &self,
        code: &SessionCode,
        claim: &Claim,
    ) -> Result<Vec<RequestRecord>, StoreError> {
        let found: Vec<Vec<String>> = self
            .run(
                &self.scripts.claim,
                code,
                &[],
                &[
                    claim.connection_id.clone(),
                    claim.lease_until.0.to_string(),
                    claim.limit.min(1_000_000).to_string(),
                    if claim.redeliver { "1" } else { "0" }.to_owned(),
                ],
            )
            .await?;
        found
            .into_iter()
            .map(|flat| request_record(&fields(flat)))
            .collect()
    }

    async fn finish(
        &self,
        code: &SessionCode,
        id: &str,
        status: RequestStatus,
        response: ToolResponse,
        answerer: Answerer<'_>,
        _now: Timestamp, // the scripts take `now` from the clock, as every script does
        until: Timestamp,
    ) -> Result<Finished, StoreError> {
        let response = serde_json::to_string(&response)
            .map_err(|error| StoreError(format!("an answer cannot be stored: {error}")))?;
        let (answerer, connection) = match answerer {
            Answerer::Relay => ("relay", ""),
            Answerer::Connection(connection) => ("connection", connection),
            Answerer::Provider => ("provider", ""),
        };
        let answer: redis::Value = self
            .run(
                &self.scripts.finish,
                code,
                &[],
                &[
                    id.to_owned(),
                    status.as_str().to_owned(),
                    response,
                    until.0.to_string(),
                    answerer.to_owned(),
                    connection.to_owned(),
                    self.limits.session_answer_budget.to_string(),
                ],
            )
            .await?;
        let (tag, record) = tagged(answer)?;
        Ok(match tag.as_str() {
            "finished" => Finished::Finished(record.ok_or_else(|| missing("call"))?),
            "already" => Finished::AlreadyFinished(record.ok_or_else(|| missing("call"))?),
            "norequest" => Finished::NoRequest,
            "notdelivered" => Finished::NotDelivered,
            _ => Finished::NoSession,
        })
    }

    async fn subscribe(&self, code: &SessionCode) -> Result<Option<EventStream>, StoreError> {
        // Subscribed before the session is read, so nothing between the two is missed.
        let stream = self.events.subscribe(&self.base(code)).await;
        Ok(self.session(code).await?.map(|_| stream))
    }

    async fn listen(&self, code: &SessionCode) -> Result<EventStream, StoreError> {
        Ok(self.events.subscribe(&self.base(code)).await)
    }

    async fn listen_for_answer(
        &self,
        code: &SessionCode,
        id: &str,
    ) -> Result<EventStream, StoreError> {
        Ok(self.events.wait_for(&self.base(code), id).await)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        let mut redis = self.redis.clone();
        let _: String = redis::cmd("PING")
            .query_async(&mut redis)
            .await
            .map_err(store_error)?;
        // Without the event connection no tab hears of a call but by the safety net.
        if !self.events.alive().await {
            return Err(StoreError("the Redis event connection is down".into()));
        }
        Ok(())
    }

    async fn open_mcp_session(
        &self,
        slot: &str,
        address: &str,
        caps: McpSessionCaps,
        expires_at: Timestamp,
    ) -> Result<Result<(), McpSessionsFull>, StoreError> {
        let full: i64 = self
            .mcp_script(&self.scripts.open_mcp)
            .arg(slot)
            .arg(address)
            .arg(expires_at.0)
            .arg(caps.per_address)
            .arg(caps.total)
            .invoke_async(&mut self.redis.clone())
            .await
            .map_err(store_error)?;
        Ok(match full {
            1 => Err(McpSessionsFull::PerAddress),
            2 => Err(McpSessionsFull::Total),
            _ => Ok(()),
        })
    }

    async fn put_mcp_session(
        &self,
        id: &str,
        slot: &str,
        address: &str,
        state: String,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        self.mcp_script(&self.scripts.put_mcp)
            .arg(id)
            .arg(slot)
            .arg(address)
            .arg(expires_at.0)
            .arg(state)
            .invoke_async::<()>(&mut self.redis.clone())
            .await
            .map_err(store_error)
    }

    async fn touch_mcp_session(&self, id: &str, expires_at: Timestamp) -> Result<bool, StoreError> {
        let kept: i64 = self
            .mcp_script(&self.scripts.touch_mcp)
            .arg(id)
            .arg(expires_at.0)
            .invoke_async(&mut self.redis.clone())
            .await
            .map_err(store_error)?;
        Ok(kept == 1)
    }

    async fn mcp_session(&self, id: &str) -> Result<Option<String>, StoreError> {
        let mut redis = self.redis.clone();
        let kept: Option<String> = redis::cmd("GET")
            .arg(format!("{}mcp:{id}", self.prefix))
            .query_async(&mut redis)
            .await
            .map_err(store_error)?;
        Ok(kept.and_then(|kept| {
            let (expires_at, rest) = kept.split_once('\n')?;
            let (_address, state) = rest.split_once('\n')?;
            (expires_at.parse::<i64>().ok()? > self.clock.now().0).then(|| state.to_owned())
        }))
    }

    async fn delete_mcp_session(&self, id: &str) -> Result<(), StoreError> {
        self.mcp_script(&self.scripts.delete_mcp)
            .arg(id)
            .invoke_async::<()>(&mut self.redis.clone())
            .await
            .map_err(store_error)
    }

    async fn lock(&self, key: &str, holder: &str, until: Timestamp) -> Result<bool, StoreError> {
        let mut redis = self.redis.clone();
        // Redis drops the key at `until` by its own clock: the replicas' milliseconds of
        // disagreement move a lock of seconds by as much.
        let taken: i64 = self
            .scripts
            .lock
            .key(format!("{}lock:{key}", self.prefix))
            .arg(holder)
            .arg(until.0)
            .invoke_async(&mut redis)
            .await
            .map_err(store_error)?;
        Ok(taken == 1)
    }

    async fn unlock(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let mut redis = self.redis.clone();
        let _: i64 = self
            .scripts
            .unlock
            .key(format!("{}lock:{key}", self.prefix))
            .arg(holder)
            .invoke_async(&mut redis)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn spend(
        &self,
        key: &str,
        budget: RateBudget,
        now: Timestamp,
    ) -> Result<Option<Duration>, StoreError> {
        let mut redis = self.redis.clone();
        let over: i64 = self
            .scripts
            .spend
            .key(self.rate_key(key))
            .arg(now.0.saturating_mul(1000))
            .arg(budget.interval_micros())
            .arg(budget.tolerance_micros())
            .invoke_async(&mut redis)
            .await
            .map_err(store_error)?;
        Ok((over > 0).then(|| Duration::from_micros(over.unsigned_abs())))
    }

    async fn usage(&self) -> Result<StoreUsage, StoreError> {
        let mut redis = self.redis.clone();
        let (forgot, sessions, unanswered, answer_bytes, ticket_bytes): (
            u64,
            usize,
            usize,
            usize,
            usize,
        ) = self
            .scripts
            .usage
            .key(format!("{}sessions", self.prefix))
            .key(format!("{}unanswered", self.prefix))
            .key(format!("{}answer-bytes", self.prefix))
            .key(format!("{}ticket-bytes", self.prefix))
            .arg(self.clock.now().0)
            .arg(USAGE_SWEEP)
            .invoke_async(&mut redis)
            .await
            .map_err(store_error)?;
        self.metrics.sessions_expired(forgot);
        Ok(StoreUsage {
            answer_bytes,
            ticket_bytes,
            sessions,
            unanswered,
        })
    }

    async fn put_ticket(
        &self,
        scope: &str,
        id: &str,
        value: Arc<Value>,
        expires_at: Timestamp,
    ) -> Result<(), StoreError> {
        let packed = pack_ticket(&value)?;
        drop(value);
        let cost = packed.len() + scope.len() + id.len() + TICKET_OVERHEAD;
        let member = format!("{id}\n{cost}\n{scope}");
        let ticket_prefix = format!("{}t:", self.prefix);
        let scope_prefix = format!("{}ts:", self.prefix);
        let mut invocation = self
            .scripts
            .put_ticket
            .key(format!("{ticket_prefix}{{{scope}}}:{id}"));
        invocation
            .key(format!("{scope_prefix}{{{scope}}}"))
            .key(format!("{}tickets", self.prefix))
            .key(format!("{}ticket-bytes", self.prefix))
            .arg(self.clock.now().0)
            .arg(packed.as_slice())
            .arg(expires_at.0)
            .arg(cost)
            .arg(member)
            .arg(scope)
            .arg(MAX_TICKETS_PER_SCOPE)
            .arg(self.ticket_budget)
            .arg(ticket_prefix)
            .arg(scope_prefix);
        let mut redis = self.redis.clone();
        let _: i64 = invocation
            .invoke_async(&mut redis)
            .await
            .map_err(store_error)?;
        Ok(())
    }

    async fn ticket(&self, scope: &str, id: &str) -> Result<Option<Arc<Value>>, StoreError> {
        let mut redis = self.redis.clone();
        let key = format!("{}t:{{{scope}}}:{id}", self.prefix);
        let (packed, expires_at): (Option<Vec<u8>>, Option<i64>) = redis::cmd("HMGET")
            .arg(&key)
            .arg("v")
            .arg("expires_at")
            .query_async(&mut redis)
            .await
            .map_err(store_error)?;
        match (packed, expires_at) {
            (Some(packed), Some(expires_at)) if expires_at > self.clock.now().0 => {
                unpack_ticket(&packed).map(|value| Some(Arc::new(value)))
            }
            _ => Ok(None),
        }
    }
}

/// A finished call announced whole (`R:` then each field of its hash as its byte length,
/// `:`, the field); `Missed` (look again) if it cannot be read.
fn announced_record(mut rest: &str) -> SessionEvent {
    let mut flat = Vec::new();
    while !rest.is_empty() {
        let Some((length, tail)) = rest.split_once(':') else {
            return SessionEvent::Missed;
        };
        let Some((field, tail)) = length
            .parse::<usize>()
            .ok()
            .and_then(|length| Some((tail.get(..length)?, tail.get(length..)?)))
        else {
            return SessionEvent::Missed;
        };
        flat.push(field.to_owned());
        rest = tail;
    }
    match request_record(&fields(flat)) {
        Ok(record) => SessionEvent::ResponseReady {
            id: record.id.clone(),
            record: Some(Box::new(record)),
        },
        Err(_) => SessionEvent::Missed,
    }
}

/// One pub/sub connection per replica, its messages fanned out to the replica's subscribers.
///
/// The lock on `sink` orders every change of what Redis is subscribed to with the map of
/// channels: a reader adds a channel (and subscribes to it) holding it, the sweep removes
/// unused channels (and unsubscribes) holding it, and a reconnect subscribes to every channel
/// holding it. So a reader that has its stream knows that Redis confirmed the subscription
/// (when Redis is there), and no unsubscription can overtake a subscription.
pub struct EventHub {
    channels: Mutex<HashMap<String, Arc<SessionChannel>>>,
    sink: tokio::sync::Mutex<Option<redis::aio::PubSubSink>>,
    /// Wakes the listener to reconnect when a subscription failed on a live connection.
    reconnect: tokio::sync::Notify,
}

impl EventHub {
    fn start(client: redis::Client) -> Arc<Self> {
        let hub = Arc::new(Self {
            channels: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            reconnect: tokio::sync::Notify::new(),
        });
        tokio::spawn(listen(Arc::downgrade(&hub), client));
        hub
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<SessionChannel>>> {
        // A std mutex: held for one map operation, never across an `.await`.
        self.channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A stream of the session's events (its key base `base`), subscribed on Redis before it
    /// is returned when Redis is there; it never ends on a Redis error, and says `Missed`
    /// every [`SAFETY_NET`].
    async fn subscribe(&self, base: &str) -> EventStream {
        self.listen(base, |channel| channel.subscribe()).await
    }

    /// [`EventHub::subscribe`] for one call's waiter ([`Store::listen_for_answer`]).
    async fn wait_for(&self, base: &str, id: &str) -> EventStream {
        self.listen(base, |channel| channel.wait_for(id)).await
    }

    /// `listen` on the session's channel, subscribed on Redis (see [`EventHub::subscribe`]).
    async fn listen(
        &self,
        base: &str,
        listen: impl FnOnce(&Arc<SessionChannel>) -> EventStream,
    ) -> EventStream {
        let channel = format!("{base}ev");
        let mut sink = self.sink.lock().await;
        // The listener is there before Redis is asked (under the sink's lock, so the sweep
        // cannot take the channel away in between).
        let (events, new) = {
            let mut channels = self.channels();
            match channels.get(&channel) {
                Some(listeners) => (listen(listeners), false),
                None => {
                    let listeners = SessionChannel::new();
                    let events = listen(&listeners);
                    channels.insert(channel.clone(), listeners);
                    (events, true)
                }
            }
        };
        if new && let Some(connected) = sink.as_mut() {
            let subscribed = tokio::time::timeout(RESPONSE_TIMEOUT, connected.subscribe(&channel))
                .await
                .unwrap_or_else(|_| Err(timed_out()));
            if let Err(error) = subscribed {
                // The listener reconnects, subscribes to every channel and says Missed.
                tracing::warn!(%error, "could not subscribe to a session's events; reconnecting");
                *sink = None;
                self.reconnect.notify_one();
            }
        }
        drop(sink);
        let mut ticks = tokio::time::interval(SAFETY_NET);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks.reset();
        let safety =
            tokio_stream::wrappers::IntervalStream::new(ticks).map(|_| SessionEvent::Missed);
        Box::pin(futures::stream::select(events, safety))
    }

    /// Whether the pub/sub connection is there and answers a ping in time.
    async fn alive(&self) -> bool {
        let mut sink = self.sink.lock().await;
        let Some(sink) = sink.as_mut() else {
            return false;
        };
        matches!(
            tokio::time::timeout(RESPONSE_TIMEOUT, sink.ping::<redis::Value>()).await,
            Ok(Ok(_))
        )
    }

    fn deliver(&self, channel: &str, payload: &str) {
        let event = match payload {
            "q" => SessionEvent::RequestQueued,
            "m" => SessionEvent::ManifestChanged,
            "e" => SessionEvent::SessionEnded,
            other => {
                if let Some(id) = other.strip_prefix("r:") {
                    SessionEvent::ResponseReady {
                        id: id.to_owned(),
                        record: None,
                    }
                } else if let Some(fields) = other.strip_prefix("R:") {
                    announced_record(fields)
                } else if let Some(connection) = other.strip_prefix("p:") {
                    SessionEvent::ProviderChanged(connection.to_owned())
                } else {
                    SessionEvent::Missed
                }
            }
        };
        let listeners = self.channels().get(channel).cloned();
        if let Some(listeners) = listeners {
            listeners.announce(event);
        }
    }

    /// Forgets channels nobody listens to; returns those still wanted.
    fn wanted(&self) -> Vec<String> {
        let mut channels = self.channels();
        channels.retain(|_, listeners| listeners.in_use());
        channels.keys().cloned().collect()
    }

    /// Tells every local subscriber to look again: messages may have been lost.
    fn missed_all(&self) {
        let everyone: Vec<_> = self.channels().values().cloned().collect();
        for listeners in everyone {
            listeners.announce(SessionEvent::Missed);
        }
    }

    /// On a new connection: subscribes to every wanted channel and installs the connection,
    /// holding the sink's lock so that no reader joins in between; then says `Missed` to
    /// everyone, who look again with their events flowing. False if a subscription failed.
    async fn resubscribe(&self, mut connected: redis::aio::PubSubSink) -> bool {
        let mut sink = self.sink.lock().await;
        for channel in self.wanted() {
            let subscribed =
                tokio::time::timeout(RESPONSE_TIMEOUT, connected.subscribe(&channel)).await;
            if !matches!(subscribed, Ok(Ok(()))) {
                return false;
            }
        }
        *sink = Some(connected);
        drop(sink);
        self.missed_all();
        true
    }

    /// Unsubscribes from sessions no local reader follows any more.
    async fn unsubscribe_unused(&self) {
        let mut sink = self.sink.lock().await;
        let unused: Vec<String> = {
            let mut channels = self.channels();
            let unused: Vec<String> = channels
                .iter()
                .filter(|(_, listeners)| !listeners.in_use())
                .map(|(channel, _)| channel.clone())
                .collect();
            for channel in &unused {
                channels.remove(channel);
            }
            unused
        };
        if let Some(connected) = sink.as_mut()
            && !unused.is_empty()
        {
            let _ = tokio::time::timeout(RESPONSE_TIMEOUT, connected.unsubscribe(&unused)).await;
        }
    }
}

/// Keeps the hub's pub/sub connection: connects, subscribes to what is wanted, delivers
/// messages, and on a drop reconnects (with `Missed` for everyone, as messages may be lost).
async fn listen(hub: Weak<EventHub>, client: redis::Client) {
    let mut delay = Duration::from_millis(100);
    loop {
        let Some(strong) = hub.upgrade() else { return };
        match tokio::time::timeout(RESPONSE_TIMEOUT, client.get_async_pubsub())
            .await
            .unwrap_or_else(|_| Err(timed_out()))
        {
            Ok(pubsub) => {
                let (sink, mut stream) = pubsub.split();
                let subscribed = strong.resubscribe(sink).await;
                drop(strong);
                if subscribed {
                    delay = Duration::from_millis(100);
                    let mut sweep = tokio::time::interval(Duration::from_secs(30));
                    let mut heartbeat = tokio::time::interval(HEARTBEAT);
                    loop {
                        let Some(strong) = hub.upgrade() else { return };
                        tokio::select! {
                            message = stream.next() => {
                                let Some(message) = message else { break };
                                let channel = message.get_channel_name();
                                let payload: String = message.get_payload().unwrap_or_default();
                                strong.deliver(channel, &payload);
                            }
                            () = strong.reconnect.notified() => break,
                            _ = sweep.tick() => strong.unsubscribe_unused().await,
                            _ = heartbeat.tick() => {
                                // A half-open connection (a Redis that vanished without a
                                // FIN) ends no stream: a ping that is not answered does.
                                if !strong.alive().await {
                                    break;
                                }
                            }
                        }
                    }
                }
                tracing::warn!("lost the Redis event connection; reconnecting");
                if let Some(hub) = hub.upgrade() {
                    *hub.sink.lock().await = None;
                }
            }
            Err(error) => {
                drop(strong);
                tracing::warn!(%error, "Redis events are not reachable yet; retrying");
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}
