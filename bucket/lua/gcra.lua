-- gcra.lua: generic cell rate algorithm with reservations.
--
-- KEYS[1]  theoretical arrival time (TAT): a string, µs since the Unix
--          epoch on the server's clock; expires once the bucket is full
-- KEYS[2]  pause key of the budget (see pause.lua)
-- ARGV[1]  n, permits asked (integer ≥ 1), all or nothing, at most the
--          burst. A negative value -k asks for up to k (coalesced callers),
--          one slot each, as many as fit within maxWait (or within each
--          caller's wait, ARGV[7..]), from 1 to k.
-- ARGV[2]  emission interval in µs: interval / limit, rounded up (≥ 1)
-- ARGV[3]  tolerance in µs: burst × emission
-- ARGV[4]  maxWait in µs: how far ahead the caller accepts a slot (≥ 0)
-- KEYS[3]  optional: live limit, a string set by an operator (SetLimit);
--          when present, emission = ceil(ARGV[5] / limit) and tolerance =
--          burst × emission, burst = ARGV[6], or the live limit if 0
-- ARGV[5]  interval in µs (with KEYS[3])
-- ARGV[6]  burst set by the caller, or 0 when the burst follows the limit
-- ARGV[7..] optional, for an up-to take: the callers' waits in µs (as
--          ARGV[4], which is the first), in ascending order, in pairs: a
--          wait and how many callers have it; caller i takes the next slot
--          if it comes within its wait, and is refused alone if not
--
-- Returns {granted, delay_us, remaining, reset_us}:
--   granted 1: the permits are the caller's from delay_us on (0: now).
--   granted 0: the earliest slot is delay_us away, beyond maxWait.
--   granted 2: n is above the burst in force (a live limit lowered it):
--              no wait would help.
-- remaining: permits free at once after this call (granted: not clamped,
-- negative when the slots given are ahead; for an up-to call, caller i's
-- is remaining plus the slots given after its own); reset_us: time until
-- the bucket is full again. A fifth element is the live limit used (0: the
-- caller's ARGV). Then {taken, emission_us, floor_us, next_us, first_us}:
-- the permits granted (0 when denied), the emission interval used, the
-- pause left, the wait for one more permit after this call, and (granted
-- only) the unclamped wait of the first slot granted: for an up-to call,
-- permit i (0-based) is the caller's from max(first_us + i × emission_us,
-- floor_us, 0) on. With each caller's wait (ARGV[7..]) the reply goes on
-- with each caller's delay, -1 for one refused (trailing ones left out).
--
-- Guarantee: in any span t, at most burst + t / emission permits, counted at
-- their slot times. A denied call changes nothing. A pause moves every slot
-- to the pause's end or later.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[1])
local upTo = n < 0
if upTo then n = -n end
local em = tonumber(ARGV[2])
local tol = tonumber(ARGV[3])
local maxWait = tonumber(ARGV[4])
local live = 0
if KEYS[3] then
  live = tonumber(redis.call('GET', KEYS[3]) or '0') or 0
  if live > 0 then
    em = math.ceil(tonumber(ARGV[5]) / live)
    local burst = tonumber(ARGV[6])
    if burst < 1 then burst = live end
    tol = burst * em
  end
end

-- An up-to call's slots are one permit each, as k calls of one would be:
-- each within the burst.
if not upTo and n * em > tol then
  return {2, 0, 0, 0, live, 0, em, 0, 0}
end

local pl = redis.call('PTTL', KEYS[2])
if pl > 0 then pl = pl * 1000 else pl = 0 end

local tat = tonumber(redis.call('GET', KEYS[1]) or 0) or 0
if tat < now + pl then tat = now + pl end
local first = tat + em - tol - now
-- Slot j (1-based) waits tat + j × em - tol - now, or the pause's end.
local each = {}
if upTo and #ARGV > 6 then
  -- The next slot to each caller in turn that can wait for it.
  local j = 0
  for i = 7, #ARGV - 1, 2 do
    local wait = tonumber(ARGV[i])
    for c = 1, tonumber(ARGV[i + 1]) do
      if j == n then break end
      local w = math.max(first + j * em, pl)
      if w <= wait then
        j = j + 1
        each[#each + 1] = math.max(w, 0)
      else
        each[#each + 1] = -1
      end
    end
  end
  while each[#each] == -1 do each[#each] = nil end
  -- none: the refusal below, for one slot; else the last slot given is
  -- within its caller's wait
  n = math.max(j, 1)
  if j > 0 then maxWait = each[#each] end
elseif upTo then
  -- keep the slots within maxWait (the pause floor only moves them later)
  local fit = math.floor((maxWait + tol + now - tat) / em)
  if fit < n then n = fit end
  if n < 1 then n = 1 end
end
local new = tat + n * em
local wait = math.max(new - tol - now, pl)

if wait > maxWait then
  local rem = math.max(math.floor((now + tol - tat) / em), 0)
  return {0, wait, rem, tat - now, live, 0, em, pl, wait}
end

redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1)
local rem = math.floor((now + tol - new) / em)
if wait < 0 then wait = 0 end
local nxt = math.max(new + em - tol - now, pl)
local res = {1, wait, rem, new - now, live, n, em, pl, nxt, first}
for _, d in ipairs(each) do res[#res + 1] = d end
return res
