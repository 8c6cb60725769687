-- The live session: SESSION_FIELDS' values, or false.
local session = open(KEYS[1])
if not live(session) then return false end
return session_values(session)
