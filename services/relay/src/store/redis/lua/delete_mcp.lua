-- Forgets session (or place) `id`.
local id = ARGV[3]
local _, address = kept(id)
redis.call('DEL', prefix .. 's:' .. id)
redis.call('ZREM', live, id)
if address then redis.call('ZREM', live .. ':' .. address, id) end
return 0
