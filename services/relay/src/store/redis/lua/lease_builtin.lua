-- Leases the unanswered built-in call `id` to `holder` until `until`, if it is free: not yet
-- taken by a run (held by 'relay'), leased to `holder` already (a renewal), or its lease ran
-- out. The call packed, or false.
local id, holder, until_ms = ARGV[3], ARGV[4], ARGV[5]
local session = open(KEYS[1], { record_field(id), 'queue' })
if not live(session) then return false end
local record = read_call(session, id)
if not record then return false end
if record.builtin ~= '1' or expire_if_due(session, record) then
  save(session)
  return false
end
local renewal = record.delivered_to == holder
local unstarted = record.delivered_to == 'relay'
local free = record.status == 'queued' or (record.status == 'delivered'
  and (renewal or unstarted or record.lease_until == '' or tonumber(record.lease_until) <= now))
if not free then return false end
-- A run after the first (counted when the call was queued) is a takeover.
if not renewal and not unstarted then
  record.deliveries = num(tonumber(record.deliveries) + 1)
end
record.status = 'delivered'
record.delivered_to = holder
record.lease_until = until_ms
local packed = write_call(session, record)
save(session)
return packed
