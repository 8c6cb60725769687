-- Replaces the session's provider token (its hash): 1, or 0 when the session does not live.
local token_hash = ARGV[3]
local session = open(KEYS[1])
if not live(session) then return 0 end
redis.call('HSET', session.s, 'token_hash', token_hash)
return 1
