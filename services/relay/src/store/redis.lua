-- The Redis store's scripts: every change that must not race is one of these, run atomically
-- by Redis. This file is their shared library; each script's body is appended to it
-- (store/redis.rs) and it reads:
--
--   KEYS[1]  the session's key base, `<prefix>{<CODE>}:` (the hash tag keeps a session in one
--            Cluster slot); the session's keys are base .. s | m | q | d | f | a | r:<id>
--   ARGV[1]  now (ms since the epoch, the calling replica's clock)
--   ARGV[2]  the global prefix (answer budget keys)
--   ARGV[3]  how long finished calls are kept (ms)
--   ARGV[4]  the answer budget (bytes)
--   ARGV[5…] the script's own arguments
--
-- Every script answers { calls it expired, sessions it found expired, its own answer }: the
-- calling replica counts the first two in its metrics (store/redis.rs, `run`).
--
-- Payloads (arguments, answers, manifests) are opaque strings here: cjson would rewrite their
-- numbers. Only timestamps and counters, all below 2^53, are read as numbers.

local base = KEYS[1]
local now = tonumber(ARGV[1])
local prefix = ARGV[2]
local retention = tonumber(ARGV[3])
local budget = tonumber(ARGV[4])
local S = base .. 's'
-- Finished calls whose answer is at most this long are announced whole (ANNOUNCED_ANSWER_BYTES).
local announced_answer_bytes = 65536

-- The session's TTL-bound keys (request keys carry their own TTL). `a` holds the session's kept
-- answers (sorted set: the budget's members by when they were kept), and the session hash's
-- `answer_bytes` what they cost: the session's share of the budget, counted in its own slot.
local SESSION_KEYS = { 's', 'm', 'q', 'd', 'f', 'a' }
-- Every live session's code by its expiry, and every unanswered call (`<code>\n<id>`) by its
-- deadline: what the metrics count across replicas (sessions alive, calls waiting), read
-- without looking at any session. Outside the sessions' slots, like the answer budget.
local SESSIONS = prefix .. 'sessions'
local UNANSWERED = prefix .. 'unanswered'
-- What this script expired, for the calling replica to count.
local expired_calls, expired_sessions = 0, 0

-- The session's fields the scripts read, fetched once per script (`live` fetches them all in
-- one HMGET) and kept up to date by the script's own writes.
local CACHED = { 'expires_at', 'max_expires_at', 'keys_until', 'manifest_revision', 'p_conn' }
local cache = nil

local function fetch()
  local values = redis.call('HMGET', S, unpack(CACHED))
  cache = {}
  for i, name in ipairs(CACHED) do cache[name] = values[i] end
end

local function session_field(name)
  if cache == nil then fetch() end
  local value = cache[name]
  if value == nil then
    value = redis.call('HGET', S, name)
    cache[name] = value
  end
  return value
end

local function forget_cached()
  cache = nil
end

-- Gives `key` the TTL of the session's keys (a key just created has none).
local function keep(key)
  local until_ms = session_field('keys_until') or session_field('expires_at')
  if until_ms then redis.call('PEXPIREAT', base .. key, until_ms) end
end

local function code_of()
  return string.match(base, '{(.*)}:$')
end

-- Slides the expiry to `until` (never backwards, never past the maximum lifetime). The
-- session's `expires_at` moves exactly (and its place in SESSIONS with it); its keys' Redis
-- TTLs are set a tenth of the time to live beyond it and moved only when the expiry passes
-- them, so most slides are one HSET and one ZADD (an expired session whose keys linger that
-- little longer is ended by `live` all the same).
local function slide(until_ms)
  local expires = tonumber(session_field('expires_at'))
  local max = tonumber(session_field('max_expires_at'))
  if until_ms > max then until_ms = max end
  if until_ms <= expires then return end
  redis.call('HSET', S, 'expires_at', until_ms)
  cache.expires_at = tostring(until_ms)
  redis.call('ZADD', SESSIONS, until_ms, code_of())
  local keys_until = tonumber(session_field('keys_until') or '0')
  if until_ms > keys_until then
    keys_until = math.min(max, until_ms + math.floor((until_ms - now) / 10))
    redis.call('HSET', S, 'keys_until', keys_until)
    cache.keys_until = tostring(keys_until)
    for _, key in ipairs(SESSION_KEYS) do redis.call('PEXPIREAT', base .. key, keys_until) end
  end
end

local function unanswered_member(id)
  return code_of() .. '\n' .. id
end

-- An answer's entry in the budget: `<seq>\n<code>\n<id>\n<cost>`. Answers finished in the same
-- millisecond have the same score; the zero-padded sequence keeps them in finishing order.
local function answer_member(id, cost)
  local seq = redis.call('INCR', prefix .. 'answer-seq')
  return string.format('%016d', seq) .. '\n' .. code_of() .. '\n' .. id .. '\n' .. cost
end

-- Stops counting an answer (its budget member) against the session of key base `owner`, if it
-- is counted there; the session's keys exist whenever its `a` does (they share their TTL).
local function uncount_in_session(owner, member)
  if redis.call('ZREM', owner .. 'a', member) == 1 then
    redis.call('HINCRBY', owner .. 's', 'answer_bytes', -tonumber(string.match(member, '\n(%d+)$')))
  end
end

-- Stops counting an answer against the budget and this session's share.
local function uncount(member)
  if redis.call('ZREM', prefix .. 'answers', member) == 1 then
    redis.call('DECRBY', prefix .. 'answer-bytes', string.match(member, '\n(%d+)$'))
  end
  uncount_in_session(base, member)
end

-- Forgets a finished call: its record, and its answer's cost if still counted.
local function forget(id)
  local r = base .. 'r:' .. id
  local fields = redis.call('HMGET', r, 'member', 'evicted')
  if fields[1] and fields[2] ~= '1' then uncount(fields[1]) end
  redis.call('DEL', r)
end

-- Ends the session: its calls and keys go (with their answers' cost), subscribers hear it.
-- `expired`: it ends because it expired (counted, unless a sweep counted it already).
local function end_session(expired)
  for _, id in ipairs(redis.call('LRANGE', base .. 'f', 0, -1)) do forget(id) end
  for _, id in ipairs(redis.call('ZRANGE', base .. 'q', 0, -1)) do
    redis.call('DEL', base .. 'r:' .. id)
    redis.call('ZREM', UNANSWERED, unanswered_member(id))
  end
  for _, key in ipairs(SESSION_KEYS) do redis.call('DEL', base .. key) end
  forget_cached()
  if redis.call('ZREM', SESSIONS, code_of()) == 1 and expired then
    expired_sessions = expired_sessions + 1
  end
  redis.call('PUBLISH', base .. 'ev', 'e')
end

-- Forgets up to `limit` sessions past their expiry from SESSIONS (Redis drops their keys by
-- itself), counting them as expired, and the unanswered calls past their deadline.
local function sweep_expired(limit)
  for _, code in ipairs(redis.call('ZRANGEBYSCORE', SESSIONS, '-inf', now, 'LIMIT', 0, limit)) do
    expired_sessions = expired_sessions + redis.call('ZREM', SESSIONS, code)
  end
  redis.call('ZREMRANGEBYSCORE', UNANSWERED, '-inf', now)
end

-- Whether the session lives at `now`; one past its expiry is ended at once.
local function live()
  local expires = session_field('expires_at')
  if not expires then return false end
  if tonumber(expires) <= now then
    end_session(true)
    return false
  end
  return true
end

-- Evicts the oldest answers (of any session) until those kept fit `budget`; their records
-- stay, marked evicted. Also drops the count of answers older than `retention`, whose
-- records have expired by themselves.
local function keep_within()
  local answers = prefix .. 'answers'
  local bytes = prefix .. 'answer-bytes'
  local stale = redis.call('ZRANGEBYSCORE', answers, '-inf', now - retention, 'LIMIT', 0, 100)
  for _, member in ipairs(stale) do
    local cost = string.match(member, '\n(%d+)$')
    redis.call('ZREM', answers, member)
    redis.call('DECRBY', bytes, cost)
    uncount_in_session(prefix .. '{' .. string.match(member, '^%d+\n(.-)\n') .. '}:', member)
  end
  local rounds = 0
  while tonumber(redis.call('GET', bytes) or '0') > budget and rounds < 1000 do
    local popped = redis.call('ZPOPMIN', answers, 1)
    if #popped == 0 then break end
    local code, id, cost = string.match(popped[1], '^%d+\n(.-)\n(.-)\n(%d+)$')
    redis.call('DECRBY', bytes, cost)
    local owner = prefix .. '{' .. code .. '}:'
    uncount_in_session(owner, popped[1])
    local r = owner .. 'r:' .. id
    if redis.call('EXISTS', r) == 1 then redis.call('HSET', r, 'response', '', 'evicted', '1') end
    rounds = rounds + 1
  end
end

-- Evicts this session's oldest answers until those it keeps fit `share` (its share of the
-- budget), counted in its own keys; their records stay, marked evicted. Also stops counting
-- its answers older than `retention`, whose records have expired by themselves.
local function keep_share(share)
  local kept = base .. 'a'
  for _, member in ipairs(redis.call('ZRANGEBYSCORE', kept, '-inf', now - retention, 'LIMIT', 0, 100)) do
    uncount(member)
  end
  local rounds = 0
  while tonumber(redis.call('HGET', S, 'answer_bytes') or '0') > share and rounds < 1000 do
    local oldest = redis.call('ZRANGE', kept, 0, 0)[1]
    if not oldest then break end
    uncount(oldest)
    local r = base .. 'r:' .. string.match(oldest, '^%d+\n.-\n(.-)\n%d+$')
    if redis.call('EXISTS', r) == 1 then redis.call('HSET', r, 'response', '', 'evicted', '1') end
    rounds = rounds + 1
  end
end

-- Tells the session's subscribers that call `id` is finished, with the finished record (the
-- HGETALL `fields`) when its answer is small enough (each field as its byte length, ':', the
-- field), so that a waiter need not read it.
local function announce_finished(id, fields, response)
  if string.len(response) > announced_answer_bytes then
    redis.call('PUBLISH', base .. 'ev', 'r:' .. id)
    return
  end
  local parts = {}
  for i, field in ipairs(fields) do
    parts[i] = string.len(field) .. ':' .. field
  end
  redis.call('PUBLISH', base .. 'ev', 'R:' .. table.concat(parts))
end

-- Gives a pending call its final answer and files it among the finished ones. Its arguments
-- go; its hash still identifies it. It is kept `retention` ms, within the per-session cap.
-- Returns the finished record (HGETALL).
local function finish_record(id, status, response)
  local r = base .. 'r:' .. id
  local cost = 256 + string.len(id) + string.len(response)
  local member = answer_member(id, cost)
  redis.call('HSET', r, 'status', status, 'response', response, 'finished_at', now,
    'lease_until', '', 'args', '', 'member', member)
  redis.call('PEXPIREAT', r, now + retention)
  redis.call('ZREM', base .. 'q', id)
  redis.call('ZREM', base .. 'd', id)
  redis.call('ZREM', UNANSWERED, unanswered_member(id))
  local finished = redis.call('RPUSH', base .. 'f', id)
  if finished == 1 then keep('f') end
  redis.call('ZADD', prefix .. 'answers', now, member)
  redis.call('INCRBY', prefix .. 'answer-bytes', cost)
  redis.call('ZADD', base .. 'a', now, member)
  if redis.call('ZCARD', base .. 'a') == 1 then keep('a') end
  redis.call('HINCRBY', S, 'answer_bytes', cost)
  while finished > 1000 do
    forget(redis.call('LPOP', base .. 'f'))
    finished = finished - 1
  end
  local fields = redis.call('HGETALL', r)
  announce_finished(id, fields, response)
  return fields
end

-- Expires the unanswered calls past their deadline (their answer is built by the reader).
local function expire_due()
  local due = redis.call('ZRANGEBYSCORE', base .. 'd', '-inf', now)
  for _, id in ipairs(due) do
    local status = redis.call('HGET', base .. 'r:' .. id, 'status')
    if status == 'queued' or status == 'delivered' then
      finish_record(id, 'expired', '')
      expired_calls = expired_calls + 1
    else
      redis.call('ZREM', base .. 'd', id)
    end
  end
end
