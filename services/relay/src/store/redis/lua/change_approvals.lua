-- Makes one change to the session's approvals (`SessionStore::change_approvals`): a new book
-- if the book is still `expected` (`book_set` '1'; `expected_set` '' for no book), whether its
-- tab approves callers and whether it refuses new ones ('' leaves each), a caller allowed
-- (`allow`, with what to keep of it) or disconnected (`revoke`), and the held calls of
-- `release` queued ('queue') or failed with the error `fail_code`, `fail_message`. Answers 1,
-- 0 when the book moved (nothing changed), false when there is no session.
local book_set, expected_set, expected, book, approves, refused, allow, allow_kept, revoke,
  release, release_mode, fail_code, fail_message =
  ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9], ARGV[10], ARGV[11], ARGV[12],
  ARGV[13], ARGV[14], ARGV[15]
local session = open(KEYS[1], { 'ap_book', 'ap_held', 'ap_allowed', 'queue' })
if not live(session) then return false end
if book_set == '1' then
  local current = field(session, 'ap_book')
  if (expected_set == '1' and current ~= expected) or (expected_set ~= '1' and current) then
    return 0
  end
  set(session, 'ap_book', book)
end
if approves ~= '' then set(session, 'ap_on', approves) end
if refused ~= '' then set(session, 'ap_refused', refused) end
local listed = field(session, 'ap_allowed') or ''
local function unlisted(id)
  local at = string.find(' ' .. listed, ' ' .. id .. ' ', 1, true)
  if at then listed = string.sub(listed, 1, at - 1) .. string.sub(listed, at + #id + 1) end
end
if allow ~= '' then
  unlisted(allow)
  listed = listed .. allow .. ' '
  set(session, 'a:' .. allow, allow_kept)
end
if revoke ~= '' then
  unlisted(revoke)
  remove(session, { 'a:' .. revoke })
end
set(session, 'ap_allowed', listed)
if release ~= '' then
  local kept, ids = '', {}
  for entry in string.gmatch(field(session, 'ap_held') or '', '%S+') do
    local caller, id = string.match(entry, '^([^=]*)=(.*)$')
    if caller == release then ids[#ids + 1] = id else kept = kept .. entry .. ' ' end
  end
  set(session, 'ap_held', kept)
  read_calls(session, ids)
  local queued = false
  for _, id in ipairs(ids) do
    local record = read_call(session, id)
    if record and record.status == 'awaiting_approval' then
      if release_mode == 'queue' then
        record.status = 'queued'
        write_call(session, record)
        queued = true
      else
        local response = cjson.encode({ requestId = id, success = false,
          error = { code = fail_code, message = fail_message } })
        finish_record(session, record, 'failed', response,
          FINISHED_CALL_BYTES + #id + #fail_code + #fail_message)
      end
    end
  end
  save(session)
  if queued then publish(session, 'q') end
end
save(session)
publish(session, 'a')
return 1
