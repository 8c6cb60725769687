-- Makes a connection the session's provider and announces it. The session, or false.
local connection, transport, connected_at, last_seen = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local session = open(KEYS[1])
if not live(session) then return false end
set(session, 'p_conn', connection)
set(session, 'p_transport', transport)
set(session, 'p_connected_at', connected_at)
set(session, 'p_last_seen', last_seen)
save(session)
publish(session, 'p:' .. connection)
return session_values(session)
