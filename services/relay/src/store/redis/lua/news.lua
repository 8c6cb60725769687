-- News of a running call from its tab (KEYS[1]: the session's hash), only while the call is
-- delivered and unfinished: progress (`value`, its number; '' for a log message) is kept as
-- the call's `g:<id>` — which finishing the call deletes — when it is above the value kept
-- (progress increases; a lower one is dropped), and the news is announced on the session's
-- channel `channel` unless it is '' (the call's waiter is on the calling replica, which tells
-- it itself). Answers 1 if it was told, else 0.
local id, news, value, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local record = redis.call('HGET', KEYS[1], 'r:' .. id)
if not record or not string.match(record, '^%d+ d ') then return 0 end
if value ~= '' then
  local kept = redis.call('HGET', KEYS[1], 'g:' .. id)
  if kept then
    local ok, decoded = pcall(cjson.decode, kept)
    if ok and type(decoded) == 'table' and tonumber(decoded.progress)
        and tonumber(value) <= tonumber(decoded.progress) then
      return 0
    end
  end
  redis.call('HSET', KEYS[1], 'g:' .. id, news)
end
if channel ~= '' then redis.call('PUBLISH', channel, 'N:' .. id .. ' ' .. news) end
return 1
