-- The Redis store's scripts: every change that must not race is one of these, run atomically
-- by Redis. This file is their shared library; each script's body is appended to it
-- (store/redis.rs) and it reads:
--
--   KEYS[1]  the session's key base, `<prefix>{<CODE>}:` (the hash tag keeps a session in one
--            Cluster slot); the session's keys are base .. s | m | q | d | f | r:<id>
--   ARGV[1]  now (ms since the epoch, the calling replica's clock)
--   ARGV[2]  the global prefix (answer budget keys)
--   ARGV[3]  how long finished calls are kept (ms)
--   ARGV[4]  the answer budget (bytes)
--   ARGV[5…] the script's own arguments
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

-- The session's TTL-bound keys (request keys carry their own TTL).
local SESSION_KEYS = { 's', 'm', 'q', 'd', 'f' }

local function session_field(name)
  return redis.call('HGET', S, name)
end

-- Gives `key` the session's expiry.
local function keep(key)
  local expires = session_field('expires_at')
  if expires then redis.call('PEXPIREAT', base .. key, expires) end
end


-- Slides the expiry to `until` (never backwards, never past the maximum lifetime).
local function slide(until_ms)
  local expires = tonumber(session_field('expires_at'))
  local max = tonumber(session_field('max_expires_at'))
  if until_ms > max then until_ms = max end
  if until_ms > expires then
    redis.call('HSET', S, 'expires_at', until_ms)
    for _, key in ipairs(SESSION_KEYS) do redis.call('PEXPIREAT', base .. key, until_ms) end
  end
end

local function code_of()
  return string.match(base, '{(.*)}:$')
end

-- An answer's entry in the budget: `<seq>\n<code>\n<id>\n<cost>`. Answers finished in the same
-- millisecond have the same score; the zero-padded sequence keeps them in finishing order.
local function answer_member(id, cost)
  local seq = redis.call('INCR', prefix .. 'answer-seq')
  return string.format('%016d', seq) .. '\n' .. code_of() .. '\n' .. id .. '\n' .. cost
end

-- Forgets a finished call: its record, and its answer's cost if still counted.
local function forget(id)
  local r = base .. 'r:' .. id
  local fields = redis.call('HMGET', r, 'member', 'evicted')
  if fields[1] and fields[2] ~= '1' then
    if redis.call('ZREM', prefix .. 'answers', fields[1]) == 1 then
      redis.call('DECRBY', prefix .. 'answer-bytes', string.match(fields[1], '\n(%d+)$'))
    end
  end
  redis.call('DEL', r)
end

-- Ends the session: its calls and keys go (with their answers' cost), subscribers hear it.
local function end_session()
  for _, id in ipairs(redis.call('LRANGE', base .. 'f', 0, -1)) do forget(id) end
  for _, id in ipairs(redis.call('ZRANGE', base .. 'q', 0, -1)) do
    redis.call('DEL', base .. 'r:' .. id)
  end
  for _, key in ipairs(SESSION_KEYS) do redis.call('DEL', base .. key) end
  redis.call('PUBLISH', base .. 'ev', 'e')
end

-- Whether the session lives at `now`; one past its expiry is ended at once.
local function live()
  local expires = session_field('expires_at')
  if not expires then return false end
  if tonumber(expires) <= now then
    end_session()
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
  end
  local rounds = 0
  while tonumber(redis.call('GET', bytes) or '0') > budget and rounds < 1000 do
    local popped = redis.call('ZPOPMIN', answers, 1)
    if #popped == 0 then break end
    local code, id, cost = string.match(popped[1], '^%d+\n(.-)\n(.-)\n(%d+)$')
    redis.call('DECRBY', bytes, cost)
    local r = prefix .. '{' .. code .. '}:r:' .. id
    if redis.call('EXISTS', r) == 1 then redis.call('HSET', r, 'response', '', 'evicted', '1') end
    rounds = rounds + 1
  end
end

-- Tells the session's subscribers that call `id` is finished, with the finished record when
-- it is small enough (each field as its byte length, ':', the field), so that a waiter need
-- not read it.
local function announce_finished(id)
  local r = base .. 'r:' .. id
  if tonumber(redis.call('HSTRLEN', r, 'response')) > announced_answer_bytes then
    redis.call('PUBLISH', base .. 'ev', 'r:' .. id)
    return
  end
  local parts = {}
  for _, field in ipairs(redis.call('HGETALL', r)) do
    parts[#parts + 1] = string.len(field) .. ':' .. field
  end
  redis.call('PUBLISH', base .. 'ev', 'R:' .. table.concat(parts))
end

-- Gives a pending call its final answer and files it among the finished ones. Its arguments
-- go; its hash still identifies it. It is kept `retention` ms, within the per-session cap.
local function finish_record(id, status, response)
  local r = base .. 'r:' .. id
  local cost = 256 + string.len(id) + string.len(response)
  local member = answer_member(id, cost)
  redis.call('HSET', r, 'status', status, 'response', response, 'finished_at', now,
    'lease_until', '', 'args', '', 'member', member)
  redis.call('PEXPIREAT', r, now + retention)
  redis.call('ZREM', base .. 'q', id)
  redis.call('ZREM', base .. 'd', id)
  redis.call('RPUSH', base .. 'f', id)
  keep('f')
  redis.call('ZADD', prefix .. 'answers', now, member)
  redis.call('INCRBY', prefix .. 'answer-bytes', cost)
  while redis.call('LLEN', base .. 'f') > 1000 do
    forget(redis.call('LPOP', base .. 'f'))
  end
  announce_finished(id)
end

-- Expires the unanswered calls past their deadline (their answer is built by the reader).
local function expire_due()
  local due = redis.call('ZRANGEBYSCORE', base .. 'd', '-inf', now)
  for _, id in ipairs(due) do
    local status = redis.call('HGET', base .. 'r:' .. id, 'status')
    if status == 'queued' or status == 'delivered' then
      finish_record(id, 'expired', '')
    else
      redis.call('ZREM', base .. 'd', id)
    end
  end
end
