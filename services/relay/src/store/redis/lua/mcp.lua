-- In front of the MCP client session scripts. Every key carries the hash tag `{mcp}` (one
-- slot): KEYS[1] every live session by expiry (`…{mcp}:live`); one client's are counted in
-- `…{mcp}:live:<address>`, a session's state kept at `…{mcp}:s:<id>` as
-- "expires_at\naddress\nstate". ARGV[1] the key prefix (`<prefix>{mcp}:`), ARGV[2] now (ms).
local live, prefix, now = KEYS[1], ARGV[1], tonumber(ARGV[2])
local function drop_expired(set)
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now)
end
local function count(member, address, expires_at)
  redis.call('ZADD', live, expires_at, member)
  local mine = live .. ':' .. address
  redis.call('ZADD', mine, expires_at, member)
  redis.call('PEXPIREAT', mine, expires_at, 'GT')
  if redis.call('PTTL', mine) < 0 then redis.call('PEXPIREAT', mine, expires_at) end
end
local function uncount(member, address)
  redis.call('ZREM', live, member)
  redis.call('ZREM', live .. ':' .. address, member)
end
local function kept(id)
  local text = redis.call('GET', prefix .. 's:' .. id)
  if not text then return nil end
  local expires_at, address, state = string.match(text, '^(%d+)\n([^\n]*)\n(.*)$')
  return tonumber(expires_at), address, state
end
