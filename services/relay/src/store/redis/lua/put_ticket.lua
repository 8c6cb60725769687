-- Keeps a claim check. Every ticket key carries the hash tag `{tickets}` (one slot): KEYS the
-- ticket, its scope's set, every ticket by expiry, their bytes. Members of the last two are
-- `<id>\n<cost>\n<scope>`.
local t, ts, all, bytes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now, value, expires_at, cost, member, scope, max_per_scope, budget, ticket_prefix,
  scope_prefix = tonumber(ARGV[1]), ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[5], ARGV[6],
  tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], ARGV[10]
local function drop(dropped)
  local id, dropped_cost, dropped_scope = string.match(dropped, '^(.-)\n(%d+)\n(.*)$')
  if redis.call('ZREM', all, dropped) == 1 then redis.call('DECRBY', bytes, dropped_cost) end
  redis.call('DEL', ticket_prefix .. dropped_scope .. '\n' .. id)
  redis.call('ZREM', scope_prefix .. dropped_scope, id)
end
for _, expired in ipairs(redis.call('ZRANGEBYSCORE', all, '-inf', now, 'LIMIT', 0, 100)) do
  drop(expired)
end
local previous = redis.call('HGET', t, 'member')
if previous then drop(previous) end
while redis.call('ZCARD', ts) >= max_per_scope do
  local oldest = redis.call('ZRANGE', ts, 0, 0)[1]
  local oldest_member = redis.call('HGET', ticket_prefix .. scope .. '\n' .. oldest, 'member')
  if oldest_member then drop(oldest_member) else redis.call('ZREM', ts, oldest) end
end
while tonumber(redis.call('GET', bytes) or '0') + cost > budget do
  local popped = redis.call('ZRANGE', all, 0, 0)
  if #popped == 0 then break end
  drop(popped[1])
end
redis.call('HSET', t, 'v', value, 'expires_at', expires_at, 'member', member)
redis.call('PEXPIREAT', t, expires_at)
redis.call('ZADD', ts, expires_at, string.match(member, '^(.-)\n'))
redis.call('PEXPIREAT', ts, expires_at)
redis.call('ZADD', all, expires_at, member)
redis.call('INCRBY', bytes, cost)
return 1
