-- Keeps session `id` in place `slot` of client `address` until `expires_at`, its state `state`.
local id, slot, address, expires_at, state = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
uncount(slot, address)
count(id, address, expires_at)
redis.call('SET', prefix .. 's:' .. id, expires_at .. '\n' .. address .. '\n' .. state, 'PXAT', expires_at)
return 0
