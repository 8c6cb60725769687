-- The answer budget's trim (one replica, off the calls' path): evicts the session's oldest
-- answers until it keeps at most `keep` bytes of them. Answers what it keeps.
local keep_bytes = tonumber(ARGV[3])
local session = open(KEYS[1])
if not live(session) then return 0 end
forget_stale(session)
keep_share(session, keep_bytes)
save(session)
return count(session, 'answer_bytes')
