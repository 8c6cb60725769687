-- The library in front of every session script (after the `#!lua` line and the constants of
-- store/rules.rs, `rules::lua_preamble`). Every key a script touches carries its session's
-- hash tag, so each script stays in one Cluster slot.
--
-- A session `<prefix>{<CODE>}:` has:
--   s      hash: the session (SESSION_FIELDS), its counters and its provider
--   q      sorted set: its unfinished calls by queue position
--   f      list: its finished calls, oldest first, each `<finished_at>:<cost>:<id>`; the first
--          `kept_from` of them had their answer evicted (eviction goes oldest first too)
--   r:<id> string: one call, packed (FIELDS, each as `<length>:<value>`, in this order)
-- and the channel `ev` for its events.
--
-- Payloads (arguments, answers) are opaque strings here: cjson would rewrite their numbers.
-- Numbers are written with `num` (Lua's tostring would write 1.7e+12).

local now = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
-- What the script did that the calling replica counts or files (see `finish_script`).
local expired_calls = 0
local slid_to = 0

-- Keys passed to one command at most (Lua's stack bounds `unpack`).
local UNPACK_BATCH = 512

local function num(value)
  return string.format('%.0f', value)
end

local FIELDS = { 'id', 'seq', 'tool_id', 'function', 'args', 'status', 'created_at', 'deadline',
  'delivered_to', 'lease_until', 'deliveries', 'response', 'finished_at', 'builtin',
  'correlation_id', 'call_hash', 'evicted' }

local function unpack_record(packed)
  local record, at = {}, 1
  for _, name in ipairs(FIELDS) do
    local colon = string.find(packed, ':', at, true)
    local length = tonumber(string.sub(packed, at, colon - 1))
    record[name] = string.sub(packed, colon + 1, colon + length)
    at = colon + length + 1
  end
  return record
end

local function pack_record(record)
  local parts = {}
  for i, name in ipairs(FIELDS) do
    local value = record[name] or ''
    parts[i] = #value .. ':' .. value
  end
  return table.concat(parts)
end

local SESSION_FIELDS = { 'code', 'token_hash', 'created_at', 'expires_at', 'max_expires_at',
  'keys_until', 'mcp_handle', 'manifest', 'manifest_revision', 'next_seq', 'pending',
  'finished', 'answer_bytes', 'kept_from', 'oldest_at', 'p_conn', 'p_transport',
  'p_connected_at', 'p_last_seen' }

-- A session: its keys, its fields as read (one HMGET), and what the script changes in them,
-- written by `save` in one HSET.
local function open(base)
  local values = redis.call('HMGET', base .. 's', unpack(SESSION_FIELDS))
  local fields = {}
  for i, name in ipairs(SESSION_FIELDS) do fields[name] = values[i] end
  return { base = base, s = base .. 's', q = base .. 'q', f = base .. 'f', fields = fields,
    changes = {} }
end

local function field(session, name)
  return session.changes[name] or session.fields[name]
end

local function count(session, name)
  return tonumber(field(session, name) or '0') or 0
end

local function set(session, name, value)
  session.changes[name] = value
end

local function save(session)
  local flat = {}
  for name, value in pairs(session.changes) do
    flat[#flat + 1] = name
    flat[#flat + 1] = value
  end
  if #flat > 0 then redis.call('HSET', session.s, unpack(flat)) end
  for name, value in pairs(session.changes) do session.fields[name] = value end
  session.changes = {}
end

-- The session as the replica reads it: SESSION_FIELDS' values in order ('' for none).
local function session_values(session)
  local out = {}
  for i, name in ipairs(SESSION_FIELDS) do out[i] = field(session, name) or '' end
  return out
end

local function publish(session, message)
  redis.call('PUBLISH', session.base .. 'ev', message)
end

local function record_key(session, id)
  return session.base .. 'r:' .. id
end

-- Ends the session: its keys go (its calls with them), subscribers hear it.
local function end_session(session)
  local keys = { session.s, session.q, session.f }
  for _, id in ipairs(redis.call('ZRANGE', session.q, 0, -1)) do
    keys[#keys + 1] = record_key(session, id)
  end
  for _, entry in ipairs(redis.call('LRANGE', session.f, 0, -1)) do
    keys[#keys + 1] = record_key(session, string.match(entry, '^%d+:%d+:(.*)$'))
  end
  for at = 1, #keys, UNPACK_BATCH do
    redis.call('DEL', unpack(keys, at, math.min(at + UNPACK_BATCH - 1, #keys)))
  end
  session.changes = {}
  publish(session, 'e')
end

-- Whether the session lives at `now`; one past its expiry is ended at once.
local function live(session)
  local expires = session.fields.expires_at
  if not expires then return false end
  if tonumber(expires) <= now then
    end_session(session)
    return false
  end
  return true
end

-- rules::slide: moves the expiry to `until_ms` (capped by the maximum lifetime) when that is a
-- step of a SLIDE_STEP_DIVISORth of the time to live or more. The keys' own TTLs run a whole
-- time to live beyond, so they move about once per time to live (a session whose keys linger
-- that long after its expiry is ended by `live` all the same).
local function slide(session, until_ms)
  local expires = count(session, 'expires_at')
  local max = count(session, 'max_expires_at')
  if until_ms > max then until_ms = max end
  local step = math.floor((until_ms - now) / SLIDE_STEP_DIVISOR)
  if until_ms <= expires or (until_ms - expires < step and until_ms ~= max) then return end
  set(session, 'expires_at', num(until_ms))
  slid_to = until_ms
  if until_ms > count(session, 'keys_until') then
    local keys_until = math.min(max, until_ms + (until_ms - now))
    set(session, 'keys_until', num(keys_until))
    -- Only the keys it has (a PEXPIREAT on a missing key is a command all the same): the
    -- queue exists while calls are pending, the finished list while some are kept.
    redis.call('PEXPIREAT', session.s, keys_until)
    if count(session, 'pending') > 0 then redis.call('PEXPIREAT', session.q, keys_until) end
    if count(session, 'finished') > 0 then redis.call('PEXPIREAT', session.f, keys_until) end
  end
end

-- Gives a new key of the session (its queue or its finished list) the session keys' TTL.
local function keep(session, key)
  redis.call('PEXPIREAT', key, field(session, 'keys_until') or field(session, 'expires_at'))
end

-- Tells the session's subscribers that a call is finished: the record whole when its answer
-- is small enough (ANNOUNCED_ANSWER_BYTES), so that a waiter need not read it.
local function announce_finished(session, record, packed)
  if #record.response > ANNOUNCED_ANSWER_BYTES then
    publish(session, 'r:' .. record.id)
  else
    publish(session, 'R:' .. packed)
  end
end

-- What a finished call's record costs once its answer is gone (rules::expired_cost).
local function record_cost(id)
  return FINISHED_CALL_BYTES + #id
end

-- Forgets the `n` oldest finished calls: their records, and what they still cost (the whole
-- call, or its record alone when its answer was evicted).
local function forget_oldest(session, n)
  local entries = redis.call('LRANGE', session.f, 0, n - 1)
  local kept_from = count(session, 'kept_from')
  local bytes = count(session, 'answer_bytes')
  local keys = {}
  for i, entry in ipairs(entries) do
    local cost, id = string.match(entry, '^%d+:(%d+):(.*)$')
    if i > kept_from then bytes = bytes - tonumber(cost) else bytes = bytes - record_cost(id) end
    keys[#keys + 1] = record_key(session, id)
  end
  if #keys > 0 then redis.call('DEL', unpack(keys)) end
  redis.call('LTRIM', session.f, #entries, -1)
  set(session, 'kept_from', num(math.max(0, kept_from - #entries)))
  set(session, 'answer_bytes', num(math.max(0, bytes)))
  set(session, 'finished', num(count(session, 'finished') - #entries))
  local head = redis.call('LINDEX', session.f, 0)
  set(session, 'oldest_at', head and string.match(head, '^(%d+):') or '')
end

-- Keeps what the session's finished calls cost within `share`: its oldest answers are evicted
-- first (their records stay, marked evicted, at the cost of a record), then, if that is not
-- enough, its oldest finished calls are forgotten altogether.
local function keep_share(session, share)
  while count(session, 'answer_bytes') > share do
    local kept_from = count(session, 'kept_from')
    local entry = redis.call('LINDEX', session.f, kept_from)
    if not entry then
      if count(session, 'finished') == 0 then break end
      forget_oldest(session, 1)
    else
      local cost, id = string.match(entry, '^%d+:(%d+):(.*)$')
      local r = record_key(session, id)
      local packed = redis.call('GET', r)
      if packed then
        local record = unpack_record(packed)
        record.response = ''
        record.evicted = '1'
        redis.call('SET', r, pack_record(record), 'KEEPTTL')
      end
      local freed = tonumber(cost) - record_cost(id)
      set(session, 'answer_bytes', num(count(session, 'answer_bytes') - freed))
      set(session, 'kept_from', num(kept_from + 1))
    end
  end
end

-- Gives an unfinished call its final answer (`response` '' for an expired call, whose answer
-- the reader writes) and files it among the finished ones, kept `retention` ms; the finished
-- calls past MAX_FINISHED_PER_SESSION (a tenth more, then trimmed in one go) or past
-- `retention` go. Its arguments go; its hash still identifies it. Returns the record packed.
local function finish_record(session, record, status, response, cost)
  record.status = status
  record.response = response
  record.finished_at = num(now)
  record.lease_until = ''
  record.args = ''
  record.correlation_id = ''
  local packed = pack_record(record)
  redis.call('SET', record_key(session, record.id), packed, 'PX', retention)
  redis.call('ZREM', session.q, record.id)
  local finished = redis.call('RPUSH', session.f, num(now) .. ':' .. cost .. ':' .. record.id)
  if finished == 1 then
    keep(session, session.f)
    set(session, 'oldest_at', num(now))
  end
  set(session, 'finished', num(finished))
  set(session, 'pending', num(math.max(0, count(session, 'pending') - 1)))
  set(session, 'answer_bytes', num(count(session, 'answer_bytes') + cost))
  if finished > MAX_FINISHED_PER_SESSION + MAX_FINISHED_PER_SESSION / 10 then
    forget_oldest(session, finished - MAX_FINISHED_PER_SESSION)
  elseif count(session, 'oldest_at') + retention <= now then
    -- Their records have expired by themselves; their entries and costs go here.
    local stale = 0
    for _, entry in ipairs(redis.call('LRANGE', session.f, 0, 99)) do
      if tonumber(string.match(entry, '^(%d+):')) + retention > now then break end
      stale = stale + 1
    end
    if stale > 0 then forget_oldest(session, stale) end
  end
  announce_finished(session, record, packed)
  return packed
end

-- Expires an unfinished call past its deadline (its answer is written by the reader).
local function expire_if_due(session, record)
  if (record.status == 'queued' or record.status == 'delivered')
      and tonumber(record.deadline) <= now then
    expired_calls = expired_calls + 1
    return finish_record(session, record, 'expired', '', record_cost(record.id)), true
  end
  return nil, false
end

-- Drops an unfinished call whose record is gone (its key expired with the session's maximum
-- lifetime) from the queue and the pending count.
local function drop_vanished(session, id)
  redis.call('ZREM', session.q, id)
  set(session, 'pending', num(math.max(0, count(session, 'pending') - 1)))
end

-- Looks at every unfinished call: those past their deadline are expired, those whose record
-- is gone dropped, so that the pending count is what really waits.
local function settle_pending(session)
  for _, id in ipairs(redis.call('ZRANGE', session.q, 0, -1)) do
    local packed = redis.call('GET', record_key(session, id))
    if packed then
      expire_if_due(session, unpack_record(packed))
    else
      drop_vanished(session, id)
    end
  end
  save(session)
end

-- rules::is_claimable.
local function claimable(record, connection, again)
  if record.builtin == '1' or tonumber(record.deadline) <= now then return false end
  if record.status == 'queued' then return true end
  return record.status == 'delivered' and (again or record.delivered_to ~= connection
    or record.lease_until == '' or tonumber(record.lease_until) <= now)
end
