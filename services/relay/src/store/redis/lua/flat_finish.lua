-- The common path of finish.lua, flat (no library): one HMGET, the checks, one HSET, one
-- RPUSH, one publish. The call's state is read by one match of its stored line, and the
-- finished record is joined from it, a slice of the names and the answer; the names and the
-- arguments are never parsed. Off the
-- common path — a session past its expiry, a call held, answered or overdue, an answerer that
-- may not answer it, a session over its share of the answer budget or with finished calls to
-- forget — it answers `{ 'slow' }` before anything is written, and the replica runs
-- finish.lua, which decides it with the library. Answers as finish.lua does otherwise, in the
-- session script's envelope `{ calls expired (0), the expiry slid to (0: none), the answer }`.
-- The finished call is announced on the session's channel unless `quiet` ('1': the call was
-- routed and its waiter is on this replica, which tells it) and no waiter elsewhere asked for
-- it since (`l:<id>`, set by a caller's retry through enqueue.lua): the answer says which,
-- `{ 'finished', the call's message (`<id> <stored form>`), 1 announced or 0 }`.
local now = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
local id, status, response, cost, until_ms, answerer, connection, share, quiet =
  ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], ARGV[9],
  tonumber(ARGV[10]), ARGV[11]
local s, f = KEYS[1] .. 's', KEYS[1] .. 'f'
local v = redis.call('HMGET', s, 'expires_at', 'max_expires_at', 'keys_until', 'finished',
  'answer_bytes', 'oldest_at', 'queue', 'pending', 'p_conn', 'r:' .. id, 'l:' .. id, 'g:' .. id)
local EXPIRES_AT, MAX_EXPIRES_AT, KEYS_UNTIL, FINISHED, ANSWER_BYTES, OLDEST_AT, QUEUE,
  PENDING, P_CONN, RECORD, LISTENED, PROGRESS = 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12
local SLOW = { 0, 0, { 'slow' } }

local function number(i)
  return tonumber(v[i] or '0') or 0
end
if not v[EXPIRES_AT] then return { 0, 0, { 'nosession' } } end
if number(EXPIRES_AT) <= now then return SLOW end
local packed = v[RECORD]
if not packed then return { 0, 0, { 'norequest' } } end

-- The call's state, by one match of its stored line (records.rs); its names and arguments are
-- not read. `names_at` is where its names start.
local seq, record_status, delivered_to, deliveries, _, created, deadline, record_finished,
  flags, hash, correlation_id, names_at = string.match(packed,
  '^(%d+) (%a) (%S*) (%d*) (%S*) (%-?%d+) (%-?%d+) (%S*) (%d+) (%S*) (%S*) ()')
if not seq then return SLOW end -- an older relay's record: the library reads it
local created_at = tonumber(created)

-- A call kept past the retention time is gone: the library says so.
if record_finished ~= '' and created_at + tonumber(record_finished) + retention <= now then
  return SLOW
end
local builtin = tonumber(flags) % 2 == 1
if answerer ~= 'relay' then
  if answerer == 'provider' then connection = v[P_CONN] or '' end
  if builtin or connection == '' or delivered_to ~= connection then
    return { 0, 0, { 'notdelivered' } }
  end
end
local LETTER_OF = { completed = 'c', failed = 'f', expired = 'x', cancelled = 'n' }
local finished = number(FINISHED) + 1
if not LETTER_OF[status]
    or (record_status ~= 'q' and record_status ~= 'd')
    or created_at + tonumber(deadline) <= now
    or number(ANSWER_BYTES) + cost > share
    or finished > MAX_FINISHED_PER_SESSION + MAX_FINISHED_PER_SESSION / 10
    or (v[OLDEST_AT] and v[OLDEST_AT] ~= '' and tonumber(v[OLDEST_AT]) + retention <= now) then
  return SLOW
end

-- The record finished: its status, when, no lease, arguments or correlation id kept; its
-- answer as the payload.
local finished_at = string.format('%.0f', now)
local line_end = string.find(packed, '\n', names_at, true)
local tail = ' ' .. string.sub(packed, names_at, line_end) .. response
local head = seq .. ' ' .. LETTER_OF[status] .. ' ' .. delivered_to .. ' ' .. deliveries .. '  '
  .. created .. ' ' .. deadline .. ' ' .. string.format('%.0f', now - created_at) .. ' '
  .. flags .. ' ' .. hash .. ' '
local kept = head .. tail

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
local announced = id .. ' ' .. head .. correlation_id .. tail
if v[LISTENED] then redis.call('HDEL', s, 'l:' .. id) end
-- Its progress, kept while it ran (news.lua).
if v[PROGRESS] then redis.call('HDEL', s, 'g:' .. id) end
if quiet == '1' and not v[LISTENED] then
  return { 0, slid_to, { 'finished', announced, 0 } }
end
if #response > ANNOUNCED_ANSWER_BYTES then
  redis.call('PUBLISH', KEYS[1] .. 'ev', 'r:' .. id)
else
  redis.call('PUBLISH', KEYS[1] .. 'ev', 'R:' .. announced)
end
return { 0, slid_to, { 'finished', announced, 1 } }
