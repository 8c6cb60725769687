-- Gives a call its final answer unless it has one or `answerer` may not answer it ('relay':
-- any call; 'connection': a call delivered to `connection`; 'provider': one delivered to the
-- session's provider now), slides the session's expiry to `until`, and keeps the session's
-- answers within its `share` of the budget. A call past its deadline is expired instead.
-- `cost` is rules::answer_cost of the answer. The finished call is always announced (`quiet`,
-- flat_finish.lua's, is not for this rare path). Answers { outcome, the call packed }.
local id, status, response, cost, until_ms, answerer, connection, share, quiet =
  ARGV[3], ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], ARGV[9],
  tonumber(ARGV[10]), ARGV[11]
local session = open(KEYS[1], { record_field(id), 'queue' })
if not live(session) then return { 'nosession' } end
local record, packed = read_call(session, id)
if not record then return { 'norequest' } end
if answerer ~= 'relay' then
  if answerer == 'provider' then connection = field(session, 'p_conn') or '' end
  if record.builtin == '1' or connection == '' or record.delivered_to ~= connection then
    return { 'notdelivered' }
  end
end
-- A call held for the person's approval is finished only by the relay (its caller cancels it).
if record.status ~= 'queued' and record.status ~= 'delivered'
    and not (record.status == 'awaiting_approval' and answerer == 'relay') then
  return { 'already', packed }
end
local expired = expire_if_due(session, record)
if expired then
  save(session)
  return { 'already', expired }
end
local finished = finish_record(session, record, status, response, cost)
redis.call('HDEL', session.s, 'l:' .. id)
keep_share(session, share)
slide(session, until_ms)
save(session)
return { 'finished', finished }
