-- Keeps a manifest's JSON under its content hash (KEYS[1], `m:{<hash>}`) until `until` at
-- least: the longest-lived session that registered it (no reference count).
local json, until_ms = ARGV[1], ARGV[2]
if redis.call('SET', KEYS[1], json, 'NX', 'PXAT', until_ms) then return 1 end
redis.call('PEXPIREAT', KEYS[1], until_ms, 'GT')
return 0
