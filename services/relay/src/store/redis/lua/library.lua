-- The library in front of every session script (after the `#!lua` line and the constants of
-- store/rules.rs, `rules::lua_preamble`). Every key a script touches carries its session's
-- hash tag, so each script stays in one Cluster slot.
--
-- A session `<prefix>{<CODE>}:` has:
--   s  hash: the session (SESSION_FIELDS: its counters, its provider); `queue`, the ids of
--      its unfinished calls in queue order, each followed by a space (request ids have none);
--      and `r:<id>` for each of its calls, in its stored form (see `unpack_record`). A call lives in its session's hash: it costs no key of its own, and a
--      script reads (one HMGET) and writes (one HSET) the session and the call together.
--   f  list: its finished calls, oldest first, each `<finished_at>:<cost>:<id>`; the first
--      `kept_from` of them had their answer evicted (eviction goes oldest first too)
-- and the channel `ev` for its events. A finished call is kept `retention` ms: past that it
-- is gone for every reader, and its field goes at the next finish, refresh or trim of its
-- session (`forget_stale`), or with the session.
--
-- Payloads (arguments, answers) are opaque strings here: cjson would rewrite their numbers.
-- Numbers are written with `num` (Lua's tostring would write 1.7e+12).

local now = tonumber(ARGV[1])
local retention = tonumber(ARGV[2])
-- What the script did that the calling replica counts or files (see `finish_script`).
local expired_calls = 0
local slid_to = 0

-- Keys or fields passed to one command at most (Lua's stack bounds `unpack`).
local UNPACK_BATCH = 512

local function num(value)
  return string.format('%.0f', value)
end

-- A call's record: a table of these fields, its times absolute (ms) and its status a word.
-- A session's hash keeps it as one line of its state and names, then its payload (the
-- arguments while it runs, its answer once finished), as store/redis/records.rs writes it:
--   <seq> <status letter> <delivered to> <deliveries> <lease> <created> <deadline>
--   <finished> <flags> <hash> <correlation id> <tool> <function> <caller>\n<payload>
-- the lease, deadline and finished times in ms after `created` ('' for none), flags 1 for a
-- built-in call and 2 for an evicted answer. The names (tool, function, caller) are one
-- opaque string here (`names`): no script reads them; they and the correlation id stay
-- escaped. A record an older relay packed (FIELDS, each `<length>:<value>`) still reads, and
-- is written in this layout.
local FIELDS = { 'id', 'seq', 'tool_id', 'function', 'args', 'status', 'created_at', 'deadline',
  'delivered_to', 'lease_until', 'deliveries', 'response', 'finished_at', 'builtin',
  'correlation_id', 'call_hash', 'evicted', 'caller' }
local STATUS_OF = { q = 'queued', d = 'delivered', c = 'completed', f = 'failed', x = 'expired',
  n = 'cancelled', a = 'awaiting_approval' }
local LETTER_OF = { queued = 'q', delivered = 'd', completed = 'c', failed = 'f',
  expired = 'x', cancelled = 'n', awaiting_approval = 'a' }
local STORED = '^(%d+) (%a) (%S*) (%d*) (%S*) (%-?%d+) (%S*) (%S*) (%d+) (%S*) (%S*) ([^\n]*)\n'

-- A name as the stored line keeps it (`%`, space and newline escaped).
local function escaped(name)
  return (string.gsub(name or '', '[%% \n]', { ['%'] = '%25', [' '] = '%20', ['\n'] = '%0A' }))
end

-- An older relay's hash (a whole SHA digest, 64 hex digits) as this layout keeps one: its first 16
-- bytes in base64url (records::stored_hash), so that the same call asked again matches it.
local BASE64URL = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_'
local function older_hash(hex)
  if not hex or not string.find(hex, '^%x+$') or #hex ~= 64 then return hex end
  local bytes, out = {}, {}
  for i = 1, 32, 2 do bytes[#bytes + 1] = tonumber(string.sub(hex, i, i + 1), 16) end
  bytes[17], bytes[18] = 0, 0
  for i = 1, 16, 3 do
    local n = bytes[i] * 2 ^ 16 + bytes[i + 1] * 2 ^ 8 + bytes[i + 2]
    for shift = 18, 0, -6 do
      local k = math.floor(n / 2 ^ shift) % 64
      out[#out + 1] = string.sub(BASE64URL, k + 1, k + 1)
    end
  end
  -- 16 bytes are 22 characters: the last group's byte gives two.
  return table.concat(out, '', 1, 22)
end

local function unpack_older(packed)
  local record, at = {}, 1
  for _, name in ipairs(FIELDS) do
    local colon = string.find(packed, ':', at, true)
    -- A call an older relay packed has fewer fields (no caller): the rest stay unset.
    if not colon then break end
    local length = tonumber(string.sub(packed, at, colon - 1))
    record[name] = string.sub(packed, colon + 1, colon + length)
    at = colon + length + 1
  end
  record.names = escaped(record.tool_id) .. ' ' .. escaped(record['function']) .. ' '
    .. escaped(record.caller)
  record.correlation_id = escaped(record.correlation_id)
  record.call_hash = older_hash(record.call_hash)
  return record
end

-- Call `id` from its stored form.
local function unpack_record(id, stored)
  if string.find(stored, '^%d+:') then return unpack_older(stored) end
  local seq, letter, delivered_to, deliveries, lease, created, deadline, finished, flags, hash,
    correlation_id, names = string.match(stored, STORED)
  if not seq then error('call ' .. id .. ': its stored record is unreadable') end
  local at = tonumber(created)
  local function after(offset)
    if offset == '' then return '' end
    return num(at + tonumber(offset))
  end
  flags = tonumber(flags)
  local payload = string.sub(stored, string.find(stored, '\n', 1, true) + 1)
  return { id = id, seq = seq, status = STATUS_OF[letter], delivered_to = delivered_to,
    deliveries = deliveries, lease_until = after(lease), created_at = created,
    deadline = after(deadline), finished_at = after(finished),
    builtin = (flags % 2 == 1) and '1' or '0', evicted = (flags >= 2) and '1' or '0',
    call_hash = hash, correlation_id = correlation_id, names = names,
    args = (finished == '') and payload or '', response = (finished ~= '') and payload or '' }
end

-- A record in its stored form.
local function pack_record(record)
  local created = tonumber(record.created_at)
  local function since(at)
    if at == nil or at == '' then return '' end
    return num(tonumber(at) - created)
  end
  local finished = record.finished_at or ''
  local flags = ((record.builtin == '1') and 1 or 0) + ((record.evicted == '1') and 2 or 0)
  return table.concat({ record.seq, LETTER_OF[record.status], record.delivered_to or '',
    record.deliveries or '0', since(record.lease_until), record.created_at,
    since(record.deadline), since(finished), flags, record.call_hash or '',
    record.correlation_id or '', record.names }, ' ')
    .. '\n' .. ((finished ~= '') and (record.response or '') or (record.args or ''))
end

-- A call as it leaves a script: its id, then its stored form (records::unpack).
local function message(id, stored)
  return id .. ' ' .. stored
end

local SESSION_FIELDS = { 'code', 'token_hash', 'created_at', 'expires_at', 'max_expires_at',
  'keys_until', 'mcp_handle', 'manifest', 'manifest_revision', 'next_seq', 'pending',
  'finished', 'answer_bytes', 'kept_from', 'oldest_at', 'p_conn', 'p_transport',
  'p_connected_at', 'p_last_seen' }

-- The field of the session's hash that holds call `id`.
local function record_field(id)
  return 'r:' .. id
end

-- A session: its keys, its fields as read (one HMGET of SESSION_FIELDS and the `extra` fields
-- the script will need), and what the script changes in them, written by `save` in one HSET.
local function open(base, extra)
  local names = SESSION_FIELDS
  if extra then
    names = { unpack(SESSION_FIELDS) }
    for _, name in ipairs(extra) do names[#names + 1] = name end
  end
  local values = redis.call('HMGET', base .. 's', unpack(names))
  local fields = {}
  for i, name in ipairs(names) do fields[name] = values[i] end
  return { base = base, s = base .. 's', f = base .. 'f', fields = fields, changes = {} }
end

-- A field of the session as the script left it (false when it has none); one `open` did not
-- read is read now.
local function field(session, name)
  local changed = session.changes[name]
  if changed ~= nil then return changed end
  if session.fields[name] == nil then
    session.fields[name] = redis.call('HGET', session.s, name)
  end
  return session.fields[name]
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
  for at = 1, #flat, UNPACK_BATCH do
    redis.call('HSET', session.s, unpack(flat, at, math.min(at + UNPACK_BATCH - 1, #flat)))
  end
  for name, value in pairs(session.changes) do session.fields[name] = value end
  session.changes = {}
end

-- Removes fields of the session's hash at once.
local function remove(session, names)
  for at = 1, #names, UNPACK_BATCH do
    redis.call('HDEL', session.s, unpack(names, at, math.min(at + UNPACK_BATCH - 1, #names)))
  end
  for _, name in ipairs(names) do
    session.fields[name] = false
    session.changes[name] = nil
  end
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

-- Whether a finished call's record is past the retention time, and so gone for its readers.
local function retired(record)
  return record.finished_at ~= '' and tonumber(record.finished_at) + retention <= now
end

-- Call `id` as the session keeps it: its record and its message (`message`), or nil when it
-- has none (or kept it past the retention time).
local function read_call(session, id)
  local stored = field(session, record_field(id))
  if not stored then return nil end
  local record = unpack_record(id, stored)
  if retired(record) then return nil end
  return record, message(id, stored)
end

-- Writes a call's record with the session's next `save`; answers its message.
local function write_call(session, record)
  local stored = pack_record(record)
  set(session, record_field(record.id), stored)
  return message(record.id, stored)
end

-- The ids of the session's unfinished calls, in queue order.
local function queued_ids(session)
  local ids = {}
  for id in string.gmatch(field(session, 'queue') or '', '%S+') do ids[#ids + 1] = id end
  return ids
end

-- Reads the records of calls `ids` of the session with one HMGET (those not read yet).
local function read_calls(session, ids)
  local names = {}
  for _, id in ipairs(ids) do
    local name = record_field(id)
    if session.changes[name] == nil and session.fields[name] == nil then
      names[#names + 1] = name
    end
  end
  for at = 1, #names, UNPACK_BATCH do
    local batch = { unpack(names, at, math.min(at + UNPACK_BATCH - 1, #names)) }
    local values = redis.call('HMGET', session.s, unpack(batch))
    for i, name in ipairs(batch) do session.fields[name] = values[i] end
  end
end

local function enqueue_id(session, id)
  set(session, 'queue', (field(session, 'queue') or '') .. id .. ' ')
  set(session, 'pending', num(count(session, 'pending') + 1))
end

-- Takes call `id` out of the queue (if it is there).
local function dequeue_id(session, id)
  local queue = field(session, 'queue') or ''
  local at = string.find(' ' .. queue, ' ' .. id .. ' ', 1, true)
  if not at then return end
  set(session, 'queue', string.sub(queue, 1, at - 1) .. string.sub(queue, at + #id + 1))
  set(session, 'pending', num(math.max(0, count(session, 'pending') - 1)))
end

-- The callers the person allowed, in the order allowed: id, what is kept of it, id, ….
local function allowed_callers(session)
  local out = {}
  for id in string.gmatch(field(session, 'ap_allowed') or '', '%S+') do
    out[#out + 1] = id
    out[#out + 1] = field(session, 'a:' .. id) or ''
  end
  return out
end

-- Ends the session: its keys go (its calls with them), subscribers hear it.
local function end_session(session)
  redis.call('DEL', session.s, session.f)
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
    redis.call('PEXPIREAT', session.s, keys_until)
    -- A session that never finished a call has no list (a PEXPIREAT would cost all the same).
    if count(session, 'finished') > 0 then redis.call('PEXPIREAT', session.f, keys_until) end
  end
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
  local names = {}
  for i, entry in ipairs(entries) do
    local cost, id = string.match(entry, '^%d+:(%d+):(.*)$')
    if i > kept_from then bytes = bytes - tonumber(cost) else bytes = bytes - record_cost(id) end
    names[#names + 1] = record_field(id)
  end
  remove(session, names)
  redis.call('LTRIM', session.f, #entries, -1)
  set(session, 'kept_from', num(math.max(0, kept_from - #entries)))
  set(session, 'answer_bytes', num(math.max(0, bytes)))
  set(session, 'finished', num(count(session, 'finished') - #entries))
  local head = redis.call('LINDEX', session.f, 0)
  set(session, 'oldest_at', head and string.match(head, '^(%d+):') or '')
end

-- Forgets the finished calls past the retention time (a hundred at a time), if the oldest
-- is.
local function forget_stale(session)
  if field(session, 'oldest_at') == '' or count(session, 'oldest_at') + retention > now then
    return
  end
  repeat
    local stale = 0
    for _, entry in ipairs(redis.call('LRANGE', session.f, 0, 99)) do
      if tonumber(string.match(entry, '^(%d+):')) + retention > now then break end
      stale = stale + 1
    end
    if stale > 0 then forget_oldest(session, stale) end
  until stale < 100
end

-- Keeps what the session's finished calls cost within `share`: its oldest answers are evicted
-- first (their records stay, marked evicted, at the cost of a record), then, if that is not
-- enough, its oldest finished calls are forgotten altogether. With `before` (ms), only answers
-- finished at or before it are evicted, and no record is forgotten (the trim's run through the
-- sessions' answers, oldest first across them).
local function keep_share(session, share, before)
  while count(session, 'answer_bytes') > share do
    local kept_from = count(session, 'kept_from')
    local entry = redis.call('LINDEX', session.f, kept_from)
    if not entry then
      if before or count(session, 'finished') == 0 then break end
      forget_oldest(session, 1)
    else
      local at, cost, id = string.match(entry, '^(%d+):(%d+):(.*)$')
      if before and tonumber(at) > before then break end
      local record = read_call(session, id)
      if record then
        record.response = ''
        record.evicted = '1'
        write_call(session, record)
      end
      local freed = tonumber(cost) - record_cost(id)
      set(session, 'answer_bytes', num(count(session, 'answer_bytes') - freed))
      set(session, 'kept_from', num(kept_from + 1))
    end
  end
end

-- Gives an unfinished call its final answer (`response` '' for an expired call, whose answer
-- the reader writes) and files it among the finished ones; the finished calls past
-- MAX_FINISHED_PER_SESSION (a tenth more, then trimmed in one go) or past `retention` go. Its
-- arguments and correlation id go from what is kept; its hash still identifies it, and its
-- caller keeps it its own. Announces
-- and returns the record packed, with its correlation id (the finishing replica logs the call
-- under it), as the memory store does.
local function finish_record(session, record, status, response, cost)
  record.status = status
  record.response = response
  record.finished_at = num(now)
  record.lease_until = ''
  record.args = ''
  local correlation_id = record.correlation_id or ''
  record.correlation_id = ''
  local packed = write_call(session, record)
  -- Its progress, kept while it ran (news.lua).
  redis.call('HDEL', session.s, 'g:' .. record.id)
  dequeue_id(session, record.id)
  local finished = redis.call('RPUSH', session.f, num(now) .. ':' .. cost .. ':' .. record.id)
  if finished == 1 then
    redis.call('PEXPIREAT', session.f, field(session, 'keys_until') or field(session, 'expires_at'))
    set(session, 'oldest_at', num(now))
  end
  set(session, 'finished', num(finished))
  set(session, 'answer_bytes', num(count(session, 'answer_bytes') + cost))
  if finished > MAX_FINISHED_PER_SESSION + MAX_FINISHED_PER_SESSION / 10 then
    forget_oldest(session, finished - MAX_FINISHED_PER_SESSION)
  else
    forget_stale(session)
  end
  if correlation_id ~= '' then
    record.correlation_id = correlation_id
    packed = message(record.id, pack_record(record))
  end
  announce_finished(session, record, packed)
  return packed
end

-- Expires an unfinished call past its deadline (its answer is written by the reader).
local function expire_if_due(session, record)
  if (record.status == 'queued' or record.status == 'delivered'
      or record.status == 'awaiting_approval')
      and tonumber(record.deadline) <= now then
    expired_calls = expired_calls + 1
    return finish_record(session, record, 'expired', '', record_cost(record.id)), true
  end
  return nil, false
end

-- Looks at every unfinished call: those past their deadline are expired, and an id whose
-- record is missing leaves the queue, so that the pending count is what really waits.
local function settle_pending(session)
  local ids = queued_ids(session)
  read_calls(session, ids)
  for _, id in ipairs(ids) do
    local record = read_call(session, id)
    if record then
      expire_if_due(session, record)
    else
      dequeue_id(session, id)
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
