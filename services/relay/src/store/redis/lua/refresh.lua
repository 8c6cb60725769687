-- Keeps the sessions of the tabs one replica serves (a batch of them, in one slot on a
-- Cluster): KEYS their key bases, ARGV[3] `until` ('' to only look), ARGV[4…] each one's
-- connection. For each: { state, its calls waiting for an answer, its expiry, 1 if it moved }, the state 'gone' (the
-- session ended), 'replaced' (another connection serves it) or 'ok' (then, with `until`, the
-- expiry slid and its finished calls past the retention forgotten). A tab's presence is its replica's, kept apart: nothing here is written for it.
local until_ms = ARGV[3]
local out = {}
for i, base in ipairs(KEYS) do
  local connection = ARGV[3 + i]
  local session = open(base)
  if not live(session) then
    out[i] = { 'gone', 0, 0, 0 }
  elseif field(session, 'p_conn') ~= connection then
    out[i] = { 'replaced', count(session, 'pending'), count(session, 'expires_at'), 0 }
  else
    local moved = 0
    if until_ms ~= '' then
      slid_to = 0
      forget_stale(session)
      slide(session, tonumber(until_ms))
      save(session)
      if slid_to > 0 then moved = 1 end
    end
    out[i] = { 'ok', count(session, 'pending'), count(session, 'expires_at'), moved }
  end
end
return out
