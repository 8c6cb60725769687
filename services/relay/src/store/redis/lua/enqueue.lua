-- Queues a call, after spending a unit of the caller's rate budget (KEYS[2], if given) and
-- only if the session's manifest is at `revision` ('' for any): the call's one round trip in.
-- `packed` is the call as `RequestRecord::queued` made it (stored form, records::stored), its
-- queue position still to be given. When the session's provider is a connection the relay pushes to (rules::hand_over),
-- the call is queued delivered to it and announced whole ('Q:' and the call), so that
-- connection's replica forwards it without a claim; else 'q' (whoever serves the session
-- claims). With `approval` ('ask' or 'handle', rules::approval_needed), the caller
-- `approver` must be one the person allowed if the session's tab approves callers: else
-- ('ask') the call is held, `awaiting_approval` and filed under the caller in `ap_held`, or
-- ('handle', a disconnected caller handle) refused. Answers { outcome, the call packed or
-- false, the session's values or false, µs to wait when rate limited }.
local id, packed, max_pending, until_ms, revision, rate_interval, rate_tolerance, approval,
  approver =
  ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7], ARGV[8], ARGV[9], ARGV[10],
  ARGV[11]
if KEYS[2] then
  local over = gcra(KEYS[2], now * 1e3, tonumber(rate_interval), tonumber(rate_tolerance))
  if over > 0 then return { 'limited', false, false, over } end
end
local r = record_field(id)
local extra = { r, 'queue' }
if approval ~= '' then
  extra = { r, 'queue', 'ap_on', 'ap_refused', 'a:' .. approver }
end
local session = open(KEYS[1], extra)
if not live(session) then return { 'nosession', false, false } end
if revision ~= '' and (field(session, 'manifest_revision') or '0') ~= revision then
  return { 'stale', false, session_values(session) }
end
local record = unpack_record(id, packed)
local function existing()
  local call, found = read_call(session, id)
  if not call then
    -- A call kept past the retention time is gone: its id may be used again.
    if field(session, r) then forget_stale(session) end
    return nil
  end
  if call.call_hash ~= record.call_hash then return { 'conflict', false, session_values(session) } end
  local expired = expire_if_due(session, call)
  if not expired and (call.status == 'queued' or call.status == 'delivered') then
    -- Asked again, perhaps through another replica: its answer is announced to all
    -- (flat_finish.lua's `quiet` no longer holds), and a call handed to the tab is announced
    -- again — one routed (not announced) whose replica never handed it over (its queueing
    -- answered an error, say) reaches the tab this way; a tab that has it ignores it.
    set(session, 'l:' .. id, '1')
    if call.status == 'delivered' and call.builtin ~= '1' then publish(session, 'h:' .. id) end
  end
  save(session)
  return { 'existing', expired or found, session_values(session) }
end
local found = existing()
if found then return found end
local held = false
if approval ~= '' and field(session, 'ap_on') == '1' and not field(session, 'a:' .. approver) then
  if approval == 'handle' then return { 'disconnected', false, session_values(session) } end
  if field(session, 'ap_refused') == '1' then
    return { 'refused', false, session_values(session) }
  end
  held = true
end
if count(session, 'pending') >= max_pending then
  -- Calls past their deadline still count until something looks at them: look now.
  settle_pending(session)
  if count(session, 'pending') >= max_pending then
    return { 'full', false, session_values(session) }
  end
end
local seq = count(session, 'next_seq') + 1
record.seq = num(seq)
local connection = field(session, 'p_conn')
local handed = not held and record.builtin ~= '1' and connection
  and field(session, 'p_transport') ~= 'polling'
if held then
  record.status = 'awaiting_approval'
  set(session, 'ap_held', (field(session, 'ap_held') or '') .. approver .. '=' .. id .. ' ')
end
if handed then
  record.status = 'delivered'
  record.delivered_to = connection
  record.lease_until = record.deadline
  record.deliveries = '1'
end
packed = write_call(session, record)
enqueue_id(session, id)
set(session, 'next_seq', num(seq))
slide(session, until_ms)
save(session)
if held then
  -- Nothing for the tab to run yet: the relay asks the person next.
elseif not handed then
  publish(session, 'q')
elseif #packed > ANNOUNCED_ANSWER_BYTES then
  publish(session, 'h:' .. id)
else
  publish(session, 'Q:' .. packed)
end
return { 'queued', packed, session_values(session) }
