-- Opens place `slot` for client `address` until `expires_at`, unless it holds `per_address`
-- places or everyone `total`: 0, or 1 (the client's cap) or 2 (the total).
local slot, address, expires_at, per_address, total =
  ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
local mine = live .. ':' .. address
drop_expired(mine)
if redis.call('ZCARD', mine) >= per_address then return 1 end
drop_expired(live)
if redis.call('ZCARD', live) >= total then return 2 end
count(slot, address, expires_at)
return 0
