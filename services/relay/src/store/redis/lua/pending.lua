-- How many calls wait for their answer (those past their deadline are expired first), or
-- false.
local session = open(KEYS[1])
if not live(session) then return false end
for _, id in ipairs(redis.call('ZRANGE', session.q, 0, -1)) do
  local packed = redis.call('GET', record_key(session, id))
  if packed then
    expire_if_due(session, unpack_record(packed))
  else
    redis.call('ZREM', session.q, id)
    set(session, 'pending', num(math.max(0, count(session, 'pending') - 1)))
  end
end
save(session)
return count(session, 'pending')
