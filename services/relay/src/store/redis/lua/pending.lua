-- How many calls wait for their answer (those past their deadline are expired first), or
-- false.
local session = open(KEYS[1])
if not live(session) then return false end
settle_pending(session)
return count(session, 'pending')
