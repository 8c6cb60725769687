-- The session's finished calls, packed, oldest first (false when the session does not live).
local session = open(KEYS[1])
if not live(session) then return false end
local keys = {}
for _, entry in ipairs(redis.call('LRANGE', session.f, 0, -1)) do
  keys[#keys + 1] = record_key(session, string.match(entry, '^%d+:%d+:(.*)$'))
end
local out = {}
for at = 1, #keys, UNPACK_BATCH do
  for _, packed in ipairs(redis.call('MGET', unpack(keys, at, math.min(at + UNPACK_BATCH - 1, #keys)))) do
    if packed then out[#out + 1] = packed end
  end
end
return out
