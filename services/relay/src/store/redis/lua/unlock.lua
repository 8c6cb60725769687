-- Releases lock KEYS[1] if `holder` has it.
local holder = ARGV[1]
if redis.call('GET', KEYS[1]) == holder then return redis.call('DEL', KEYS[1]) end
return 0
