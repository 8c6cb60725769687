-- A place for `member` in the set of live things at KEYS[1] (members scored by when they
-- expire), unless `cap` of them live already: 1, or 0. A live member keeps its place (its
-- expiry moves forward). With `prune` = '1' the expired members go first (the live-sessions
-- set is pruned by the usage read instead, which counts each expiry once). The set is one
-- key, so on a Cluster it sits on one shard.
local now, cap, member, expires_at, prune =
  tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]
if prune == '1' then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now) end
local score = redis.call('ZSCORE', KEYS[1], member)
if score and tonumber(score) > now then
  redis.call('ZADD', KEYS[1], 'GT', expires_at, member)
  return 1
end
if redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf') >= cap then return 0 end
redis.call('ZADD', KEYS[1], expires_at, member)
return 1
