-- A rate budget: KEYS[1] its theoretical arrival time; ARGV now, the budget's interval and
-- tolerance (µs). 0 when a unit was spent, else the µs until one is there.
local now_us, interval, tolerance = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
return gcra(KEYS[1], now_us, interval, tolerance)
