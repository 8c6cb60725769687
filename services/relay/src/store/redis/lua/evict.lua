-- The answer budget's trim (one replica, off the calls' path): evicts the session's oldest
-- answers until it keeps at most `keep_bytes` bytes, only those finished at or before `before`
-- (ms) when it is given (else its oldest records go too when evicting answers is not enough).
-- Answers { what it keeps, when its oldest answer still kept finished (false: none) }.
local keep_bytes, before = tonumber(ARGV[3]), tonumber(ARGV[4])
local session = open(KEYS[1])
if not live(session) then return { 0, false } end
forget_stale(session)
keep_share(session, keep_bytes, before)
save(session)
local next = redis.call('LINDEX', session.f, count(session, 'kept_from'))
return { count(session, 'answer_bytes'), next and tonumber(string.match(next, '^(%d+):')) or false }
