-- Included in front of the scripts that spend rate budgets.

-- GCRA (rules::RateBudget::spend): spends a unit of the budget whose theoretical arrival time
-- is kept at `key`; 0 when it was there, else the µs until it is.
local function gcra(key, now_us, interval, tolerance)
  local tat = math.max(tonumber(redis.call('GET', key) or '0'), now_us)
  local next = tat + interval
  local over = next - now_us - tolerance
  if over > 0 then return over end
  redis.call('SET', key, string.format('%.0f', next), 'PX', math.ceil((next - now_us) / 1e3) + 1) -- µs to ms
  return 0
end
