-- budget.lua: take or settle a cost across the dimensions of one budget
-- (requests and tokens per minute, say), each a token bucket of its own,
-- all or nothing, in one call.
--
-- KEYS[1]  the budget's state: a hash with, per dimension name, the
--          fields 't:<name>' (tokens left in its running period; negative:
--          a debt), 'e:<name>' (its period's end, ms on this server's
--          clock) and 'c:<name>' (the debt the period inherited from the
--          ones before at its refill and still owes: limit less the
--          tokens it was refilled to; absent: 0). It expires once every
--          period has ended and every debt would have been paid, when a
--          fresh hash means the same.
-- KEYS[2]  pause key of the same budget (see pause.lua)
-- ARGV[1]  'take', 'settle' or 'pause'
-- ARGV[2]  D, the number of dimensions (integer ≥ 1)
-- ARGV[3]  for 'settle': when the grant it corrects was made, ms on this
--          server's clock (a take's now_ms); 0 when unknown. Unused by
--          'take'.
-- ARGV[4+7(i-1)..10+7(i-1)], for dimension i: its name, its limit per
--          period (integer ≥ 1), its period in ms (integer ≥ 1), the
--          amount, the end of its latest period the caller's instance
--          was told of (ms on this server's clock; 0 when none is known;
--          see "Lost period"), and 1 when it counts a sliding window (see
--          "Sliding"), else 0, and for a sliding one the start of the
--          record the caller was told of (0: none). The amount: for
--          'take', what the call asks
--          (≥ 0; 0 leaves the dimension unchecked and untouched); for
--          'settle', the change (> 0 charges, < 0 gives back, 0 leaves it
--          alone); for 'pause', how long to hold the dimension, in ms (0:
--          not at all).
--
-- Take returns {status, delay_ms, remaining, reset_ms, limit, dim, now_ms,
-- end_1, ..., end_D, start_1, ..., start_D}:
--   status 1: granted; remaining, reset_ms and limit describe the
--             dimension dim (1-based) with the least left, relative to
--             its limit, after the take.
--   status 0: refused, nothing taken; delay_ms is when every dimension
--             asked has enough (its refills, its debt paid) or the pause
--             ends; the others describe the dimension dim that binds
--             longest (remaining never below 0; -1 for a pause).
--   end_i is dimension i's period end on record (0: none); start_i the
--   start of a sliding dimension's record (see "Sliding"; 0: none, or
--   periods). A paused budget answers without them.
-- Settle and pause return {1, now_ms, end_1, ..., end_D, start_1, ...,
-- start_D}.
--
-- Sliding: a dimension counted over a sliding window keeps what its
-- grants took in slots of 1/20 of its period (the slot being
-- floor(now_ms / width)), in a ring of 21: fields 'w:<name>:<k>' (what
-- the slot took) and 's:<name>:<k>' (its slot number; a ring field of an
-- older slot counts nothing), k = slot mod 21; 'l:<name>' is when the
-- record began, µs (absent: no record; 1 in records of earlier
-- versions): its identity, that callers are told of (start_i) and tell
-- (ARGV). A take is granted when the slots that overlap the
-- last period (21 of them: the running one and the 20 before) hold, with
-- it, at most the limit: at most the limit in any span of one period,
-- counted conservatively by up to one slot. A settle changes the slot of
-- its grant (ARGV[3]) while that slot still counts, never below 0; once
-- it has left the window, or for a grant whose time is unknown, a
-- give-back does nothing and a charge goes to the running slot. Its
-- end_i is when the window is empty (0: it is). Lost record: a caller
-- that knows an end later than now, while the record is not the one it
-- knows of (none on record; or one that a caller that knew nothing began
-- after the loss: its start differs), fills the slot that leaves the
-- window at that end up to the limit and gives the record the start it
-- knows: nothing more is granted until then, so the only second grants
-- inside the lost window are those made before a caller that knew came.
-- (A record lives until its window is empty: another record before the
-- end a caller knows means the one it knew was lost.) A caller that
-- knows an end but no start holds only when no record is there.
--
-- Clock: the times of the hash (slots, ends, pauses, the reply's now_ms)
-- are on TIME plus 'off' (absent: 0), never before 'clk', the time of
-- the latest write. When TIME steps back (an NTP step; a failover to a
-- replica whose clock is behind), 'off' grows by the step, so the hash's
-- clock goes on from where it was: the grants of the slots written
-- before the step keep counting until they leave the window, instead
-- of being taken for slots of the future and counting nothing (a
-- second limit within one interval). 'off' goes with the hash.
--
-- Pause of a dimension ('pause', field 'p:<name>': until when, ms): a take
-- that asks some of it is refused until then, with delay_ms the pause
-- left. A shorter pause never shortens a longer one.
--
-- Refill: a dimension's period starts at the first take after the last
-- one ended (not before), and the take that starts it refills it: to its
-- limit, less what is still owed. A debt is paid at one limit per period
-- that has elapsed since the last period's end, idle ones included:
-- tokens = min(limit, min(tokens, 0) + k·limit), k = 1 + the whole periods
-- elapsed since that end. Tokens left at a period's end are not carried.
--
-- Settle: a charge subtracts from the tokens at once, even below 0 (a
-- debt). A charge for a budget with no period on record starts the debt
-- as if a period had just ended. A give-back belongs to the period its
-- grant was made in (ARGV[3]): while that period runs, it adds to its
-- tokens, up to its limit less the debt it inherited; once it has ended
-- (not yet refilled) it only reduces its debt. A give-back from an earlier
-- period, or of a grant whose time is unknown, only reduces the debt the
-- running period inherited (its grants were too few by as much): never a
-- token beyond that, so it is never granted a second time. A give-back
-- for a budget with no period on record does nothing.
--
-- Lost period: Redis restarted empty (or a promoted replica that had not
-- received the latest refill, or keys deleted by hand) has no record of a
-- period the fleet was told of and whose grants reached the provider. A
-- refill now would grant a second limit inside it. When the caller knows
-- an end of a dimension later than 1 ms from now on this server's clock
-- (a call delayed on its way here carries an end that has passed, which
-- holds nothing) and the record has none, or one more than half a period
-- before it, the dimension is held at 0 tokens until that end (clamped to
-- one period from now): nothing more is granted in the lost period, and
-- the next period starts on the old phase when a caller asks at its end.
-- A record whose period ends after the known end but started before it
-- began inside the lost period (a caller that knew nothing refilled after
-- the loss): it grants nothing more until its end, so what it granted
-- before a caller that knew came is the only second grant inside the lost
-- period. A give-back of a grant made in the lost period still counts in
-- it. What
-- the lost period had granted and its debts are unknown: the cost is at
-- most one period's grants, once per loss and key, and debts owed when
-- the record was lost are forgotten.
--
-- Guarantee: per dimension, refills at least one period apart on this
-- server's clock, each to at most the limit; a take is granted only when
-- every dimension asked has enough, so in any period a dimension grants,
-- net of what its own grants gave back, at most its limit; what Settle
-- charges beyond the estimates comes on top, and is paid by the next
-- refills before anything more is granted. A refused take changes no
-- tokens (it may start a period of a dimension that had ended, or hold a
-- lost one).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- The hash's clock never runs back (see "Clock"): TIME plus the offset
-- of the steps back met so far, at least the latest time written.
local clock = redis.call('HMGET', KEYS[1], 'clk', 'off')
local off = tonumber(clock[2]) or 0
local stepped = false -- a step back met now: 'off' is written
now = now + off
if tonumber(clock[1]) and tonumber(clock[1]) > now then
  off = off + tonumber(clock[1]) - now
  now = tonumber(clock[1])
  stepped = true
end
-- the same time in µs, to tell records apart (see "Sliding")
local now_us = now * 1000 + tonumber(t[2]) % 1000
local mode = ARGV[1]
local D = tonumber(ARGV[2])
local mark = tonumber(ARGV[3]) or 0
local names, limits, periods, amounts, known = {}, {}, {}, {}, {}
local toks, ends, owed, paused = {}, {}, {}, {}
-- sliding dimensions: slot width, slots counted less one, running slot,
-- the counted slots' values (index 0 the oldest), their sum, the oldest
-- slot that may be stored
local sliding, width, nslots, cur, vals, sums, low = {}, {}, {}, {}, {}, {}, {}
local kep = {} -- the record's start the caller knows (sliding; 0: none)
local SLOTS = 20
local keep_min = 1 -- ms the hash must live at least (sliding slots, pauses)
-- a slot's fields: its count and its number, in a ring of nslots+1
local function slotfield(i, s)
  return 'w:' .. names[i] .. ':' .. string.format('%.0f', s % (nslots[i] + 1))
end
local function slotnum(i, s)
  return 's:' .. names[i] .. ':' .. string.format('%.0f', s % (nslots[i] + 1))
end
for i = 1, D do
  local b = 4 + 7 * (i - 1)
  names[i] = ARGV[b]
  limits[i] = tonumber(ARGV[b + 1])
  periods[i] = tonumber(ARGV[b + 2])
  amounts[i] = tonumber(ARGV[b + 3])
  -- No period runs further ahead than one from now: an end beyond that
  -- (another server's clock, ahead of this one) holds at most that long.
  known[i] = math.min(tonumber(ARGV[b + 4]) or 0, now + periods[i])
  sliding[i] = ARGV[b + 5] == '1'
  kep[i] = tonumber(ARGV[b + 6]) or 0
  local h = redis.call('HMGET', KEYS[1], 't:' .. names[i], 'e:' .. names[i], 'c:' .. names[i], 'p:' .. names[i], 'l:' .. names[i])
  toks[i] = tonumber(h[1])
  ends[i] = tonumber(h[2])
  owed[i] = tonumber(h[3]) or 0
  paused[i] = tonumber(h[4]) or 0
  if paused[i] > now then keep_min = math.max(keep_min, paused[i] - now) end
  if sliding[i] then
    width[i] = math.max(1, math.floor(periods[i] / SLOTS))
    nslots[i] = math.ceil(periods[i] / width[i])
    cur[i] = math.floor(now / width[i])
    low[i] = tonumber(h[5])
    local f = {}
    for j = 0, nslots[i] do
      table.insert(f, slotfield(i, cur[i] - nslots[i] + j))
      table.insert(f, slotnum(i, cur[i] - nslots[i] + j))
    end
    local v = redis.call('HMGET', KEYS[1], unpack(f))
    vals[i], sums[i] = {}, 0
    for j = 0, nslots[i] do
      -- a ring field of an older slot counts nothing
      if tonumber(v[2 * j + 2]) == cur[i] - nslots[i] + j then
        vals[i][j] = tonumber(v[2 * j + 1]) or 0
      else
        vals[i][j] = 0
      end
      sums[i] = sums[i] + vals[i][j]
    end
    -- when the window is empty: the newest slot holding something leaves
    ends[i] = nil
    for j = nslots[i], 0, -1 do
      if vals[i][j] > 0 then
        ends[i] = (cur[i] - nslots[i] + j + nslots[i] + 1) * width[i]
        break
      end
    end
  end
end

-- slot_add adds a to slot s (a counted one) of sliding dimension i,
-- never below 0, and writes it.
local sliding_changed = false
local function slot_add(i, s, a)
  local j = s - (cur[i] - nslots[i])
  local v = math.max(vals[i][j] + a, 0)
  sums[i] = sums[i] - vals[i][j] + v
  vals[i][j] = v
  if not low[i] then low[i] = now_us end
  redis.call('HSET', KEYS[1], slotfield(i, s), string.format('%.0f', v), slotnum(i, s), string.format('%.0f', s), 'l:' .. names[i], string.format('%.0f', low[i]))
  if v > 0 then
    ends[i] = math.max(ends[i] or 0, (s + nslots[i] + 1) * width[i])
  end
  sliding_changed = true
end

-- slide_hold holds sliding dimension i until the end the caller knows,
-- when the record has lost the window that ends then (see "Sliding").
local function slide_hold(i)
  if known[i] <= now + 1 then
    return
  end
  if low[i] and (kep[i] == 0 or low[i] == kep[i]) then
    return -- the record the caller knows of (or it cannot tell)
  end
  local s = math.ceil(known[i] / width[i]) - nslots[i] - 1
  s = math.min(math.max(s, cur[i] - nslots[i]), cur[i])
  if kep[i] ~= 0 then low[i] = kep[i] end -- the window it knew goes on
  slot_add(i, s, limits[i] - sums[i])
end

-- ends_reply lists the dimensions' ends on record, 0 for none, then
-- the starts of their sliding records ('l:<name>'), 0 for none.
local function ends_reply(r)
  for i = 1, D do
    table.insert(r, ends[i] or 0)
  end
  for i = 1, D do
    table.insert(r, (sliding[i] and low[i]) or 0)
  end
  return r
end

-- store writes the changed dimensions and keeps the hash until every
-- period has ended and every debt would have been paid.
local function store(changed)
  local args = {}
  for i = 1, D do
    if changed[i] then
      table.insert(args, 't:' .. names[i])
      table.insert(args, string.format('%.0f', toks[i]))
      table.insert(args, 'e:' .. names[i])
      table.insert(args, string.format('%.0f', ends[i]))
      table.insert(args, 'c:' .. names[i])
      table.insert(args, string.format('%.0f', owed[i]))
    end
  end
  if #args == 0 and not sliding_changed and not stepped then return end
  table.insert(args, 'clk')
  table.insert(args, string.format('%.0f', now))
  table.insert(args, 'off')
  table.insert(args, string.format('%.0f', off))
  redis.call('HSET', KEYS[1], unpack(args))
  local keep = keep_min
  for i = 1, D do
    if sliding[i] then
      if ends[i] and ends[i] - now > keep then keep = ends[i] - now end
    elseif ends[i] then
      local n = 0
      if toks[i] < 0 then n = math.ceil(-toks[i] / limits[i]) end
      local h = ends[i] - now + n * periods[i]
      if h > keep then keep = h end
    end
  end
  redis.call('PEXPIRE', KEYS[1], keep)
end

-- hold holds dimension i at 0 until the end the caller knows, when the
-- record has lost that period (see "Lost period").
local changed = {}
local function hold(i)
  if known[i] <= now + 1 then
    return
  end
  if not ends[i] or known[i] - ends[i] > periods[i] / 2 then
    toks[i], ends[i], owed[i] = 0, known[i], 0
    changed[i] = true
  elseif ends[i] > known[i] and ends[i] - periods[i] < known[i] and toks[i] > 0 then
    -- The record's period started inside the lost one (a caller that
    -- knew nothing of it refilled after the loss): two periods cannot
    -- both run, so this one grants nothing more; it ends as recorded.
    toks[i] = 0
    changed[i] = true
  end
end

if mode == 'pause' then
  for i = 1, D do
    if amounts[i] > 0 and now + amounts[i] > paused[i] then
      paused[i] = now + amounts[i]
      redis.call('HSET', KEYS[1], 'p:' .. names[i], string.format('%.0f', paused[i]))
      keep_min = math.max(keep_min, amounts[i])
      sliding_changed = true
    end
  end
  store({})
  return ends_reply({1, now})
end

if mode == 'settle' then
  for i = 1, D do
    local a = amounts[i]
    if sliding[i] then
      if a ~= 0 then slide_hold(i) end
      local m = nil
      if mark > 0 then m = math.floor(mark / width[i]) end
      if a ~= 0 and m and m >= cur[i] - nslots[i] and m <= cur[i] then
        slot_add(i, m, a) -- the grant's slot, still counted
      elseif a > 0 then
        slot_add(i, cur[i], a)
      end
    elseif a ~= 0 then hold(i) end
    if sliding[i] then
      -- done above
    elseif a > 0 then
      if not ends[i] then
        toks[i], ends[i], owed[i] = 0, now, 0
      end
      toks[i] = toks[i] - a
      changed[i] = true
    elseif a < 0 and ends[i] then
      local g = -a
      if mark > 0 and mark >= ends[i] - periods[i] and mark < ends[i] then
        -- the grant's own period
        if ends[i] > now then
          toks[i] = math.max(toks[i], math.min(toks[i] + g, limits[i] - owed[i]))
        elseif toks[i] < 0 then
          toks[i] = math.min(toks[i] + g, 0)
        end
      elseif mark < ends[i] - periods[i] then
        -- an earlier period (or unknown): only the inherited debt
        g = math.min(g, owed[i])
        toks[i], owed[i] = toks[i] + g, owed[i] - g
      end
      changed[i] = true
    end
  end
  store(changed)
  return ends_reply({1, now})
end

local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then
  return {0, pause, -1, pause, 0, 0, now}
end

local ok = true
local delay, worst, best, bestRatio = 0, 0, 0, nil
-- rem and reset describe dimension i for the reply
local function rem(i)
  if sliding[i] then return limits[i] - sums[i] end
  return toks[i]
end
local function reset(i)
  if not sliding[i] then return ends[i] - now end
  for j = 0, nslots[i] do
    if vals[i][j] > 0 then return (cur[i] - nslots[i] + j + nslots[i] + 1) * width[i] - now end
  end
  return 0
end
for i = 1, D do
  local a = amounts[i]
  if a > 0 and paused[i] > now then
    ok = false
    if paused[i] - now > delay or worst == 0 then delay, worst = paused[i] - now, i end
  end
  if a > 0 and sliding[i] then
    slide_hold(i)
    if sums[i] + a > limits[i] then
      ok = false
      -- when enough of the oldest slots have left the window
      local left = sums[i]
      local d = periods[i]
      for j = 0, nslots[i] do
        left = left - vals[i][j]
        if left + a <= limits[i] then
          d = (cur[i] - nslots[i] + j + nslots[i] + 1) * width[i] - now
          break
        end
      end
      if d > delay or worst == 0 then delay, worst = d, i end
    end
  elseif a > 0 then
    hold(i)
    if not ends[i] or ends[i] <= now then
      -- the refill that starts a period
      local k = 1
      local carried = 0
      if ends[i] then
        k = 1 + math.floor((now - ends[i]) / periods[i])
        carried = math.min(toks[i], 0)
      end
      toks[i] = math.min(limits[i], carried + k * limits[i])
      owed[i] = limits[i] - toks[i]
      ends[i] = now + periods[i]
      changed[i] = true
    end
    if toks[i] < a then
      ok = false
      -- refills needed: the one at the period's end, then one per limit
      -- still short
      local short = a - math.min(toks[i], 0)
      local n = math.max(math.ceil(short / limits[i]), 1)
      local d = ends[i] - now + (n - 1) * periods[i]
      if d > delay or worst == 0 then delay, worst = d, i end
    end
  end
end
if not ok then
  store(changed)
  return ends_reply({0, delay, math.max(rem(worst), 0), reset(worst), limits[worst], worst, now})
end
for i = 1, D do
  if amounts[i] > 0 then
    if sliding[i] then
      slot_add(i, cur[i], amounts[i])
    else
      toks[i] = toks[i] - amounts[i]
      changed[i] = true
    end
    local r = rem(i) / limits[i]
    if bestRatio == nil or r < bestRatio then best, bestRatio = i, r end
  end
end
store(changed)
return ends_reply({1, 0, rem(best), reset(best), limits[best], best, now})
