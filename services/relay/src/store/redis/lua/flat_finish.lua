-- The common path of finish.lua, flat (no library): one HMGET, the checks, one HSET, one
-- RPUSH, one publish. The call's record is walked for the offsets of its fields (`<length>:`
-- each) and joined again from slices and the answer; nothing is unpacked into a table. Off the
-- common path — a session past its expiry, a call held, answered or overdue, an answerer that
-- may not answer it, a session over its share of the answer budget or with finished calls to
-- forget — it answers `{ 'slow' }` before anything is written, and the replica runs
-- finish.lua, which decides it with the library. Answers as finish.lua does otherwise, in the
-- session script's envelope `{ calls expired (0), the expiry slid to (0: none), the answer }`.
-- The finished call is announced on the session's channel unless `quiet` ('1': the call was
-- routed and its waiter is on this replica, which tells it) and no waiter elsewhere asked for
-- it since (`l:<id>`, set by a caller's retry through enqueue.lua): the answer says which,
-- `{ 'finished', the call, 1 announced or 0 }`.
local now = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
local id, status, response, cost, until_ms, answerer, connection, share, quiet =
  ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], ARGV[9],
  tonumber(ARGV[10]), ARGV[11]
local s, f = KEYS[1] .. 's', KEYS[1] .. 'f'
local v = redis.call('HMGET', s, 'expires_at', 'max_expires_at', 'keys_until', 'finished',
  'answer_bytes', 'oldest_at', 'queue', 'pending', 'p_conn', 'r:' .. id, 'l:' .. id)
local EXPIRES_AT, MAX_EXPIRES_AT, KEYS_UNTIL, FINISHED, ANSWER_BYTES, OLDEST_AT, QUEUE,
  PENDING, P_CONN, RECORD, LISTENED = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11
local SLOW = { 0, 0, { 'slow' } }

local function number(i)
  return tonumber(v[i] or '0') or 0
end
if not v[EXPIRES_AT] then return { 0, 0, { 'nosession' } } end
if number(EXPIRES_AT) <= now then return SLOW end
local packed = v[RECORD]
if not packed then return { 0, 0, { 'norequest' } } end

-- Where each of the record's 18 fields starts (its length), where its value starts, and where
-- it ends.
local heads, starts, ends, at = {}, {}, {}, 1
for i = 1, 18 do
  local colon = string.find(packed, ':', at, true)
  if not colon then return SLOW end -- an older relay's record: the library reads it
  local length = tonumber(string.sub(packed, at, colon - 1))
  heads[i], starts[i], ends[i] = at, colon + 1, colon + length
  at = colon + length + 1
end
local function value(i)
  return string.sub(packed, starts[i], ends[i])
end
local STATUS, DEADLINE, DELIVERED_TO, FINISHED_AT, BUILTIN, CORRELATION_ID = 6, 8, 9, 13, 14, 15

-- A call kept past the retention time is gone: the library says so.
local record_finished = value(FINISHED_AT)
if record_finished ~= '' and tonumber(record_finished) + retention <= now then return SLOW end
local record_status = value(STATUS)
if answerer ~= 'relay' then
  if answerer == 'provider' then connection = v[P_CONN] or '' end
  if value(BUILTIN) == '1' or connection == '' or value(DELIVERED_TO) ~= connection then
    return { 0, 0, { 'notdelivered' } }
  end
end
local finished = number(FINISHED) + 1
if (record_status ~= 'queued' and record_status ~= 'delivered')
    or tonumber(value(DEADLINE)) <= now
    or number(ANSWER_BYTES) + cost > share
    or finished > MAX_FINISHED_PER_SESSION + MAX_FINISHED_PER_SESSION / 10
    or (v[OLDEST_AT] and v[OLDEST_AT] ~= '' and tonumber(v[OLDEST_AT]) + retention <= now) then
  return SLOW
end

local function field(text)
  return #text .. ':' .. text
end
local function slice(from, to)
  return string.sub(packed, heads[from], ends[to])
end
-- The record finished: no arguments, lease or correlation id kept; its answer and when.
local finished_at = string.format('%.0f', now)
local function finished_record(correlation_id)
  return slice(1, 4) .. field('') .. field(status) .. slice(7, 9) .. field('') .. slice(11, 11)
    .. field(response) .. field(finished_at) .. slice(14, 14) .. field(correlation_id)
    .. slice(16, 18)
end
local kept = finished_record('')

-- Out of the queue.
local queue = v[QUEUE] or ''
local pending = number(PENDING)
local place = string.find(' ' .. queue, ' ' .. id .. ' ', 1, true)
if place then
  queue = string.sub(queue, 1, place - 1) .. string.sub(queue, place + #id + 1)
  pending = math.max(0, pending - 1)
end
local listed = redis.call('RPUSH', f, finished_at .. ':' .. cost .. ':' .. id)
local writes = { 'r:' .. id, kept, 'queue', queue, 'pending', string.format('%.0f', pending),
  'finished', string.format('%.0f', listed),
  'answer_bytes', string.format('%.0f', number(ANSWER_BYTES) + cost) }
if listed == 1 then
  redis.call('PEXPIREAT', f, v[KEYS_UNTIL] or v[EXPIRES_AT])
  writes[#writes + 1] = 'oldest_at'
  writes[#writes + 1] = finished_at
end

-- rules::slide, as the library's `slide`.
local slid_to = 0
local expires, max = number(EXPIRES_AT), number(MAX_EXPIRES_AT)
local target = math.min(until_ms, max)
local step = math.floor((target - now) / SLIDE_STEP_DIVISOR)
if not (target <= expires or (target - expires < step and target ~= max)) then
  writes[#writes + 1] = 'expires_at'
  writes[#writes + 1] = string.format('%.0f', target)
  slid_to = target
  if target > number(KEYS_UNTIL) then
    local keys_until = math.min(max, target + (target - now))
    writes[#writes + 1] = 'keys_until'
    writes[#writes + 1] = string.format('%.0f', keys_until)
    redis.call('PEXPIREAT', s, keys_until)
    redis.call('PEXPIREAT', f, keys_until)
  end
end
redis.call('HSET', s, unpack(writes))

-- Announced (and answered) with its correlation id, which the finishing replica logs.
local correlation_id = value(CORRELATION_ID)
local announced = kept
if correlation_id ~= '' then announced = finished_record(correlation_id) end
if v[LISTENED] then redis.call('HDEL', s, 'l:' .. id) end
if quiet == '1' and not v[LISTENED] then
  return { 0, slid_to, { 'finished', announced, 0 } }
end
if #response > ANNOUNCED_ANSWER_BYTES then
  redis.call('PUBLISH', KEYS[1] .. 'ev', 'r:' .. id)
else
  redis.call('PUBLISH', KEYS[1] .. 'ev', 'R:' .. announced)
end
return { 0, slid_to, { 'finished', announced, 1 } }
