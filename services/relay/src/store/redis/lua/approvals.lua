-- The session's approvals: { whether its tab approves callers ('1'), whether it refuses new
-- ones ('1'), whether it has a book ('1'), the book, its held calls (`<caller>=<id> ` each),
-- its allowed callers (id, kept, id, kept, …) }, or false when there is no session.
local session = open(KEYS[1], { 'ap_on', 'ap_refused', 'ap_book', 'ap_held', 'ap_allowed' })
if not live(session) then return false end
local book = field(session, 'ap_book')
return { field(session, 'ap_on') or '', field(session, 'ap_refused') or '', book and '1' or '',
  book or '', field(session, 'ap_held') or '', allowed_callers(session) }
