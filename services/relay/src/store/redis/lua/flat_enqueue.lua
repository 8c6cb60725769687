-- The common path of enqueue.lua, flat (no library): one HMGET of the fields it needs, its
-- checks, at most one rate spend, one HSET, at most one publish. The call's record is the
-- replica's (records.rs), in two pieces Lua joins after what only the session knows (its
-- place in the queue) and never parses: `state` (status, delivered to, deliveries and lease as
-- the replica made them: a built-in call starts out delivered to the relay), which a call
-- handed to the tab replaces (delivered to the tab's connection, once, leased until its
-- deadline: `lease`), and `rest` (times, flags, hash, names and arguments).
-- A call handed to the session's tab is announced on the session's channel, unless it may be
-- routed (`route` '1', from a replica that serves routes as `me`) and the tab's replica
-- (`p_replica`) serves routes and is not in `avoid` (' <url> … ', replicas found gone or
-- draining): then nobody else hears of it, and the answer says where it goes — 'local' (the
-- tab is on this replica) or the tab's replica — for the replica to hand it there.
-- Anything off the common path — no live session past its expiry, a manifest that moved, an
-- id that is taken, a caller the person must be asked about, a full queue — answers
-- `{ 'slow' }` before anything is written or spent, and the replica runs enqueue.lua, which
-- decides it with the library. Answers in the session script's envelope `{ calls expired (0),
-- the expiry slid to (0: none), the answer }`, the answer short: `{ 'queued', its place in the
-- queue, the connection it was handed to or '', the session's provider (connection,
-- transport, connected at, last seen; '' each for none), where it is routed or '', the
-- session's expiry, its maximum and its manifest's revision }` (the replica built the
-- record: it needs nothing else back), or as enqueue.lua answers.
local now = tonumber(ARGV[1])
local id, state, rest, builtin, lease, max_pending, until_ms, revision, rate_interval,
  rate_tolerance, approval, approver, me, avoid, route =
  ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10],
  ARGV[11], ARGV[12], ARGV[13], ARGV[14], ARGV[15], ARGV[16], ARGV[17]
local s = KEYS[1] .. 's'

local v = redis.call('HMGET', s, 'expires_at', 'max_expires_at', 'keys_until',
  'manifest_revision', 'next_seq', 'pending', 'finished', 'p_conn', 'p_transport',
  'p_connected_at', 'p_last_seen', 'p_replica', 'r:' .. id, 'queue', 'ap_on', 'a:' .. approver)
local EXPIRES_AT, MAX_EXPIRES_AT, KEYS_UNTIL, REVISION, NEXT_SEQ, PENDING, FINISHED, P_CONN,
  P_TRANSPORT, P_CONNECTED_AT, P_LAST_SEEN, P_REPLICA, RECORD, QUEUE, AP_ON, ALLOWED =
  1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16

local function spend()
  if not KEYS[2] then return 0 end
  return gcra(KEYS[2], now * 1e3, tonumber(rate_interval), tonumber(rate_tolerance))
end

if not v[EXPIRES_AT] then
  -- As enqueue.lua: the budget is spent first, then the session is found missing.
  local over = spend()
  if over > 0 then return { 0, 0, { 'limited', false, false, over } } end
  return { 0, 0, { 'nosession', false, false } }
end
local function number(i)
  return tonumber(v[i] or '0') or 0
end
if number(EXPIRES_AT) <= now
    or (revision ~= '' and (v[REVISION] or '0') ~= revision)
    or v[RECORD]
    or (approval ~= '' and v[AP_ON] == '1' and not v[ALLOWED])
    or number(PENDING) >= max_pending then
  return { 0, 0, { 'slow' } }
end
local over = spend()
if over > 0 then return { 0, 0, { 'limited', false, false, over } } end

local seq = string.format('%.0f', number(NEXT_SEQ) + 1)
local connection = v[P_CONN]
local handed = builtin ~= '1' and connection and v[P_TRANSPORT] ~= 'polling'
if handed then state = 'd ' .. connection .. ' 1 ' .. lease end
local packed = seq .. ' ' .. state .. ' ' .. rest
v[NEXT_SEQ] = seq
v[PENDING] = string.format('%.0f', number(PENDING) + 1)
local writes = { 'r:' .. id, packed, 'queue', (v[QUEUE] or '') .. id .. ' ',
  'pending', v[PENDING], 'next_seq', v[NEXT_SEQ] }

-- rules::slide, as the library's `slide`.
local slid_to = 0
local expires, max = number(EXPIRES_AT), number(MAX_EXPIRES_AT)
local target = math.min(until_ms, max)
local step = math.floor((target - now) / SLIDE_STEP_DIVISOR)
if not (target <= expires or (target - expires < step and target ~= max)) then
  v[EXPIRES_AT] = string.format('%.0f', target)
  writes[#writes + 1] = 'expires_at'
  writes[#writes + 1] = v[EXPIRES_AT]
  slid_to = target
  if target > number(KEYS_UNTIL) then
    local keys_until = math.min(max, target + (target - now))
    v[KEYS_UNTIL] = string.format('%.0f', keys_until)
    writes[#writes + 1] = 'keys_until'
    writes[#writes + 1] = v[KEYS_UNTIL]
    redis.call('PEXPIREAT', s, keys_until)
    if number(FINISHED) > 0 then redis.call('PEXPIREAT', KEYS[1] .. 'f', keys_until) end
  end
end
redis.call('HSET', s, unpack(writes))

local routed = ''
if handed and route == '1' and me ~= '' then
  local at = v[P_REPLICA]
  if at and at ~= '' and not string.find(avoid, ' ' .. at .. ' ', 1, true) then
    routed = (at == me) and 'local' or at
  end
end
if routed ~= '' then
  -- Handed by the replica, not announced.
elseif not handed then
  redis.call('PUBLISH', KEYS[1] .. 'ev', 'q')
elseif #packed > ANNOUNCED_ANSWER_BYTES then
  redis.call('PUBLISH', KEYS[1] .. 'ev', 'h:' .. id)
else
  redis.call('PUBLISH', KEYS[1] .. 'ev', 'Q:' .. id .. ' ' .. packed)
end
return { 0, slid_to, { 'queued', v[NEXT_SEQ], handed and connection or '', v[P_CONN] or '',
  v[P_TRANSPORT] or '', v[P_CONNECTED_AT] or '', v[P_LAST_SEEN] or '', routed, v[EXPIRES_AT],
  v[MAX_EXPIRES_AT] or '', v[REVISION] or '0' } }
