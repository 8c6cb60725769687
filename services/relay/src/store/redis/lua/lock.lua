-- Takes lock KEYS[1] for `holder` until `until` (ms), or renews it for its holder: 1, or 0.
local holder, until_ms = ARGV[1], ARGV[2]
local current = redis.call('GET', KEYS[1])
if current and current ~= holder then return 0 end
redis.call('SET', KEYS[1], holder, 'PXAT', until_ms)
return 1
