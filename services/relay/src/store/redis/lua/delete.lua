-- Deletes the session: 1 if it was live, else 0.
local session = open(KEYS[1])
if not live(session) then return 0 end
end_session(session)
return 1
