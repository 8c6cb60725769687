-- The session's finished calls, packed, oldest first (false when the session does not live).
local session = open(KEYS[1])
if not live(session) then return false end
local ids = {}
for _, entry in ipairs(redis.call('LRANGE', session.f, 0, -1)) do
  ids[#ids + 1] = string.match(entry, '^%d+:%d+:(.*)$')
end
read_calls(session, ids)
local out = {}
for _, id in ipairs(ids) do
  local _, packed = read_call(session, id)
  if packed then out[#out + 1] = packed end
end
return out
