-- One call, packed ('norequest' when there is none): a call past its deadline is expired
-- first.
local id = ARGV[3]
local session = open(KEYS[1], { record_field(id) })
if not live(session) then return { 'nosession' } end
local record, packed = read_call(session, id)
if not record then return { 'norequest' } end
local expired = expire_if_due(session, record)
save(session)
return { 'found', expired or packed }
