-- Makes the manifest stored under the content hash `manifest` (its JSON kept apart, under
-- `m:{<hash>}`) the session's: the new revision, or false.
local manifest = ARGV[3]
local session = open(KEYS[1])
if not live(session) then return false end
local revision = count(session, 'manifest_revision') + 1
set(session, 'manifest', manifest)
set(session, 'manifest_revision', num(revision))
save(session)
publish(session, 'm')
return revision
