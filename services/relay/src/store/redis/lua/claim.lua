-- Hands the calls `connection` may claim (rules::is_claimable; with `again` = '1' also those
-- delivered to it already: a redelivery), oldest first, at most `limit`, to that connection,
-- if it is the session's provider; leased until `lease_until`. Answers the calls packed.
local connection, lease_until, limit, again = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6] == '1'
local session = open(KEYS[1], { 'queue' })
if not live(session) or field(session, 'p_conn') ~= connection then return {} end
local ids = queued_ids(session)
read_calls(session, ids)
local out = {}
for _, id in ipairs(ids) do
  if #out >= limit then break end
  local record = read_call(session, id)
  if not record then
    dequeue_id(session, id)
  elseif not expire_if_due(session, record) and claimable(record, connection, again) then
    record.deliveries = num(tonumber(record.deliveries) + 1)
    record.status = 'delivered'
    record.delivered_to = connection
    record.lease_until = lease_until
    out[#out + 1] = write_call(session, record)
  end
end
save(session)
return out
