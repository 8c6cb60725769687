-- Moves session `id`'s expiry to `expires_at`: 1 if kept, else 0.
local id, expires_at = ARGV[3], ARGV[4]
local was, address, state = kept(id)
if not was or was <= now then return 0 end
redis.call('SET', prefix .. 's:' .. id, expires_at .. '\n' .. address .. '\n' .. state, 'PXAT', expires_at)
count(id, address, expires_at)
return 1
