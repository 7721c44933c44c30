-- budget.lua: take or settle a cost across the dimensions of one budget
-- (requests and tokens per minute, say), each a token bucket of its own,
-- all or nothing, in one call.
--
-- KEYS[1]  the budget's state: a hash with, per dimension name, the
--          fields 't:<name>' (tokens left in its running period; negative:
--          a debt) and 'e:<name>' (its period's end, ms on this server's
--          clock). It expires once every period has ended and every debt
--          would have been paid, when a fresh hash means the same.
-- KEYS[2]  pause key of the same budget (see pause.lua)
-- ARGV[1]  'take' or 'settle'
-- ARGV[2]  D, the number of dimensions (integer ≥ 1)
-- ARGV[3+4(i-1)..6+4(i-1)], for dimension i: its name, its limit per
--          period (integer ≥ 1), its period in ms (integer ≥ 1), and the
--          amount: for 'take', what the call asks (≥ 0; 0 leaves the
--          dimension unchecked and untouched); for 'settle', the change
--          (> 0 charges, < 0 gives back, 0 leaves it alone).
--
-- Take returns {status, delay_ms, remaining, reset_ms, limit, dim, now_ms}:
--   status 1: granted; remaining, reset_ms and limit describe the
--             dimension dim (1-based) with the least left, relative to
--             its limit, after the take.
--   status 0: refused, nothing taken; delay_ms is when every dimension
--             asked has enough (its refills, its debt paid) or the pause
--             ends; the others describe the dimension dim that binds
--             longest (remaining never below 0; -1 for a pause).
-- Settle returns {1, now_ms}.
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
-- as if a period had just ended. A give-back adds to the tokens of the
-- running period, up to its limit; after the period's end it only reduces
-- a debt.
--
-- Guarantee: per dimension, refills at least one period apart on this
-- server's clock, each to at most the limit; a take is granted only when
-- every dimension asked has enough, so in any period a dimension grants,
-- net of what was given back in it, at most its limit; what Settle
-- charges beyond the estimates comes on top, and is paid by the next
-- refills before anything more is granted. A refused take changes no
-- tokens (it may start a period of a dimension that had ended).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode = ARGV[1]
local D = tonumber(ARGV[2])
local names, limits, periods, amounts, toks, ends = {}, {}, {}, {}, {}, {}
for i = 1, D do
  local b = 3 + 4 * (i - 1)
  names[i] = ARGV[b]
  limits[i] = tonumber(ARGV[b + 1])
  periods[i] = tonumber(ARGV[b + 2])
  amounts[i] = tonumber(ARGV[b + 3])
  local h = redis.call('HMGET', KEYS[1], 't:' .. names[i], 'e:' .. names[i])
  toks[i] = tonumber(h[1])
  ends[i] = tonumber(h[2])
end

-- store writes dimension i and keeps the hash until every period has
-- ended and every debt would have been paid.
local function store(changed)
  local args = {}
  for i = 1, D do
    if changed[i] then
      table.insert(args, 't:' .. names[i])
      table.insert(args, string.format('%.0f', toks[i]))
      table.insert(args, 'e:' .. names[i])
      table.insert(args, string.format('%.0f', ends[i]))
    end
  end
  if #args == 0 then return end
  redis.call('HSET', KEYS[1], unpack(args))
  local keep = 1
  for i = 1, D do
    if ends[i] then
      local owed = 0
      if toks[i] < 0 then owed = math.ceil(-toks[i] / limits[i]) end
      local h = ends[i] - now + owed * periods[i]
      if h > keep then keep = h end
    end
  end
  redis.call('PEXPIRE', KEYS[1], keep)
end

if mode == 'settle' then
  local changed = {}
  for i = 1, D do
    local a = amounts[i]
    if a > 0 then
      if not ends[i] then
        toks[i], ends[i] = 0, now
      end
      toks[i] = toks[i] - a
      changed[i] = true
    elseif a < 0 and ends[i] then
      if ends[i] > now then
        toks[i] = math.min(toks[i] - a, limits[i])
        changed[i] = true
      elseif toks[i] < 0 then
        toks[i] = math.min(toks[i] - a, 0)
        changed[i] = true
      end
    end
  end
  store(changed)
  return {1, now}
end

local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then
  return {0, pause, -1, pause, 0, 0, now}
end

local changed = {}
local ok = true
local delay, worst, best, bestRatio = 0, 0, 0, nil
for i = 1, D do
  local a = amounts[i]
  if a > 0 then
    if not ends[i] or ends[i] <= now then
      -- the refill that starts a period
      local k = 1
      local carried = 0
      if ends[i] then
        k = 1 + math.floor((now - ends[i]) / periods[i])
        carried = math.min(toks[i], 0)
      end
      toks[i] = math.min(limits[i], carried + k * limits[i])
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
  return {0, delay, math.max(toks[worst], 0), ends[worst] - now, limits[worst], worst, now}
end
for i = 1, D do
  if amounts[i] > 0 then
    toks[i] = toks[i] - amounts[i]
    changed[i] = true
    local r = toks[i] / limits[i]
    if bestRatio == nil or r < bestRatio then best, bestRatio = i, r end
  end
end
store(changed)
return {1, 0, toks[best], ends[best] - now, limits[best], best, now}
