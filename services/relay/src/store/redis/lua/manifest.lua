-- The session's manifest: { revision, content hash ('' for none) }, or false.
local session = open(KEYS[1])
if not live(session) then return false end
return { count(session, 'manifest_revision'), field(session, 'manifest') or '' }
