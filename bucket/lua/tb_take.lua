-- tb_take.lua: give permits of a token bucket their places in time (after
-- schedule.lua, which says what a place and a schedule are).
--
-- A take places its permits at the earliest time the schedule leaves
-- room for them, within the caller's wait. An idle key grants its whole
-- limit at once; a caller that can wait is paced besides (see
-- TokenBucket), at INTERVAL/LIMIT per permit after the last paced place.
--
-- Guarantee: schedule.lua's, at most LIMIT places in any span of
-- INTERVAL + MARGIN; a refused take changes nothing but dropping entries
-- that stopped counting.
--
-- KEYS[1]  the key's schedule (schedule.lua)
-- KEYS[2]  pause key (pause.lua): no place while it lives
-- KEYS[3]  live limit (TokenBucket.SetLimit): replaces ARGV[2] when set
-- ARGV[1]  n ≥ 1 permits at one place, all or nothing; -k: up to k, one
--          place each (coalesced callers)
-- ARGV[2]  limit (integer ≥ 1)
-- ARGV[3]  interval, µs
-- ARGV[4]  margin, µs
-- ARGV[5]  the longest wait for a place, µs; -1 for none
-- ARGV[6]  the latest end this caller's instance was given for the key,
--          µs; 0 for none (see Schedule:lost)
-- ARGV[7]  when the schedule that end is in was born, µs (a reply's
--          born); 0 for unknown
-- ARGV[8..] optional, for an up-to take: the callers' waits (as ARGV[5],
--          which is the first), in ascending order, in pairs: a wait and
--          how many callers have it; permit i is placed within the i-th
--          caller's, and a caller its place does not fit is refused alone
--
-- Returns {status, limit, remaining, reset, now, later, born, d1, ..., dk,
-- e1, ..., ek} (µs), or {..., born, -k, d, e} when k permits of an up-to
-- take share one place:
--   status 1: granted; d_i is permit i's place less now (one place for
--             n), e_i the end it is recorded under (for tb_giveback.lua);
--             d_i = -1 and e_i = 0 for a caller refused within waits
--             given (ARGV[8..]).
--   status 0: refused, no place within the wait (or a pause).
--   status 4: n is above the limit and can never be granted.
-- later: the earliest place one more permit could have after the places
-- given (n permits, for a refused all-or-nothing take), less now: what a
-- caller refused could have, and after a grant the earliest any next
-- caller can (a paced one may get a later place); -1 for an idle key's
-- first place and for status 4.
-- remaining: LIMIT less the permits counted, at least 0 (-1 in a pause);
-- for an up-to take with a place per caller not clamped (the Go side adds
-- the permits placed after each caller's, and clamps); reset: until the
-- last of them stops counting; born: when the schedule was born (0 when
-- not read).
local interval, margin = tonumber(ARGV[3]), tonumber(ARGV[4])
local maxWait, known, born = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit = tonumber(redis.call('GET', KEYS[3]) or '') or tonumber(ARGV[2])
local n = tonumber(ARGV[1])
local upTo = n < 0
if upTo then n = -n end
if not upTo and n > limit then return {4, limit, 0, 0, now, -1, 0} end
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then return {0, limit, -1, pause * 1000, now, pause * 1000, 0} end

-- An idle key (no schedule) gives one place now: nothing to read.
local one = upTo and 1 or n
if known == 0 and (not upTo or n == 1) and redis.call('EXISTS', KEYS[1]) == 0 then
  local e = now + margin
  redis.call('RPUSH', KEYS[1], string.format('%d %d 1 0 %d %d', one, math.ceil(now + one * interval / limit), limit, now),
    string.format('%d %d', e, one))
  redis.call('PEXPIRE', KEYS[1], math.ceil((e + interval - now) / 1000) + 1) -- as Schedule:save
  return {1, limit, limit - one, e + interval - now, now, -1, now, 0, e}
end
local s = openSchedule(KEYS[1], interval, now)
s.limit = limit
s:lost(known, born, limit)
if s.older then s:add(s.older, limit) end -- the previous version's period: its grants unknown
-- The pace: none below a millisecond a permit (above 1,000 permits a
-- second): no provider tells it from a burst, and each place would cost
-- its caller a timer.
local pace = interval / limit
if pace < 1000 then pace = 0 end
-- place puts c permits at the paced place when the wait allows, else at
-- the earliest place within the wait; it returns nil when there is none,
-- and the earliest place in any case.
local function place(c)
  local w = s:earliest(c, limit)
  if w == nil then return nil, nil end
  local p = math.ceil(pace > 0 and math.max(w, s.tat) or w) -- unpaced: as early as the limit allows
  if maxWait < 0 or p - now <= maxWait then
    s.tat = p + c * pace
  elseif w - now <= maxWait then
    p = w
    s.tat = math.max(s.tat, p + c * pace)
  else
    return nil, w
  end
  return p, w, s:add(p + margin, c)
end
local out, ends, later = {}, {}, -1
local waits = {}
if upTo then
  for i = 8, #ARGV - 1, 2 do
    local w = tonumber(ARGV[i])
    for j = 1, tonumber(ARGV[i + 1]) do waits[#waits + 1] = w end
  end
end
if upTo and n > 1 and pace == 0 then
  -- Unpaced, an up-to take's permits that fit at once share one place
  -- (the reply's -k form when all fit); the others, a place each in turn,
  -- as below.
  local c = math.min(n, limit - s.count)
  local p, w, e
  if c > 0 then p, w, e = place(c) end
  if p and c == n then
    later = (s:earliest(1, limit) or now + interval) - now
    if s:changed() then s:save() end
    return {1, limit, math.max(limit - s.count, 0), s:reset(), now, later, s.born, -c, p - now, e}
  end
  if p then
    for i = 1, c do out[i], ends[i] = p - now, e end
  end
end
local refused = false
for i = #out + 1, upTo and n or 1 do
  maxWait = waits[i] or maxWait
  local p, w, e = place(upTo and 1 or n)
  if p == nil then
    refused = true
    -- A later caller, which can wait longer, may still fit.
    if w == nil or waits[i + 1] == nil then break end
    out[i], ends[i] = -1, 0
  else
    out[i], ends[i] = p - now, e
  end
end
while out[#out] == -1 do out[#out], ends[#ends] = nil, nil end
if refused or #out > 0 then later = (s:earliest((upTo or not refused) and 1 or n, limit) or now + interval) - now end
if s:changed() then s:save() end
local res = {#out > 0 and 1 or 0, limit, upTo and limit - s.count or math.max(limit - s.count, 0), s:reset(), now, later, s.born}
for _, d in ipairs(out) do res[#res + 1] = d end
for _, e in ipairs(ends) do res[#res + 1] = e end
return res
