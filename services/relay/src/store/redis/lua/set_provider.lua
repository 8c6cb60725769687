-- Makes a connection the session's provider and announces it, with the replica it is on
-- (`replica`, where other replicas forward its calls; '' where calls are not routed). The
-- session, or false.
local connection, transport, connected_at, last_seen, replica =
  ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local session = open(KEYS[1])
if not live(session) then return false end
set(session, 'p_conn', connection)
set(session, 'p_transport', transport)
set(session, 'p_connected_at', connected_at)
set(session, 'p_last_seen', last_seen)
if replica ~= '' then set(session, 'p_replica', replica) end
save(session)
if replica == '' then redis.call('HDEL', session.s, 'p_replica') end
publish(session, 'p:' .. connection)
return session_values(session)
