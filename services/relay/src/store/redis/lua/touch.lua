-- Slides the session's expiry to `until`; with `seen`, only if that connection is its provider,
-- which is then recorded as heard from now. The session (SESSION_FIELDS' values), or false.
local until_ms, seen = tonumber(ARGV[3]), ARGV[4]
local session = open(KEYS[1])
if not live(session) then return false end
if seen ~= '' then
  if field(session, 'p_conn') ~= seen then return session_values(session) end
  set(session, 'p_last_seen', num(now))
end
slide(session, until_ms)
save(session)
return session_values(session)
