-- Inserts a new session unless its code is taken by a live one: 1, or 0.
local code, token_hash, created_at, expires_at, max_expires_at, mcp_handle =
  ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local session = open(KEYS[1])
if live(session) then return 0 end
redis.call('DEL', session.s, session.f)
redis.call('HSET', session.s, 'code', code, 'token_hash', token_hash, 'created_at', created_at,
  'expires_at', expires_at, 'max_expires_at', max_expires_at, 'keys_until', expires_at,
  'mcp_handle', mcp_handle, 'manifest', '', 'manifest_revision', 0, 'next_seq', 0,
  'pending', 0, 'finished', 0, 'answer_bytes', 0, 'kept_from', 0, 'oldest_at', '')
redis.call('PEXPIREAT', session.s, expires_at)
return 1
