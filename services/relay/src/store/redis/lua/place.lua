-- A place for `member` in the set of live things at KEYS[1] (members scored by when they
-- expire), unless `cap` of them live already: 1, or 0. A member that has a place keeps it (its
-- expiry moves forward). The set is one key, so on a Cluster it sits on one shard.
local now, cap, member, expires_at = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
if redis.call('ZSCORE', KEYS[1], member) then
  redis.call('ZADD', KEYS[1], 'GT', expires_at, member)
  return 1
end
if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') >= cap then return 0 end
redis.call('ZADD', KEYS[1], expires_at, member)
return 1
