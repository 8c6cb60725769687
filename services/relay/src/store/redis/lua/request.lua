-- One call, packed ('norequest' when there is none): a call past its deadline is expired
-- first.
local id = ARGV[3]
local session = open(KEYS[1])
if not live(session) then return { 'nosession' } end
local packed = redis.call('GET', record_key(session, id))
if not packed then return { 'norequest' } end
local expired = expire_if_due(session, unpack_record(packed))
save(session)
return { 'found', expired or packed }
