-- Removes the provider if it is still the given connection.
local connection = ARGV[3]
local session = open(KEYS[1])
if live(session) and field(session, 'p_conn') == connection then
  redis.call('HDEL', session.s, 'p_conn', 'p_transport', 'p_connected_at', 'p_last_seen',
    'p_replica')
end
return 1
