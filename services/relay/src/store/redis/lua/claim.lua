-- Hands the calls `connection` may claim (rules::is_claimable; with `again` = '1' also those
-- delivered to it already: a redelivery), oldest first, at most `limit`, to that connection,
-- if it is the session's provider; leased until `lease_until`. Answers the calls packed.
local connection, lease_until, limit, again = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6] == '1'
local session = open(KEYS[1])
if not live(session) or field(session, 'p_conn') ~= connection then return {} end
local out = {}
for _, id in ipairs(redis.call('ZRANGE', session.q, 0, -1)) do
  if #out >= limit then break end
  local r = record_key(session, id)
  local packed = redis.call('GET', r)
  if packed then
    local record = unpack_record(packed)
    if not expire_if_due(session, record) and claimable(record, connection, again) then
      record.deliveries = num(tonumber(record.deliveries) + 1)
      record.status = 'delivered'
      record.delivered_to = connection
      record.lease_until = lease_until
      packed = pack_record(record)
      redis.call('SET', r, packed, 'KEEPTTL')
      out[#out + 1] = packed
    end
  else
    drop_vanished(session, id)
  end
end
save(session)
return out
