-- window.lua: fixed windows aligned to the epoch on the server's clock
-- (start = now - now mod length, now its TIME), one or more tiers that
-- must all pass (FixedWindow is one tier, Tiers several).
--
-- KEYS[1]    pause key of the budget (see pause.lua)
-- KEYS[1+i]  tier i's counter: a hash {w = window start (µs since the Unix
--            epoch), c = permits granted in that window, l = its limit,
--            fixed by its first grant}, expiring at the window's end
-- ARGV[1]    n, permits asked (integer ≥ 1), all or nothing. A negative
--            value -k asks for up to k (coalesced callers): as many as
--            every tier has room for, from 1 to k.
-- ARGV[2i]   tier i's limit (integer ≥ 1)
-- ARGV[2i+1] tier i's window length in microseconds (integer ≥ 1000)
-- KEYS[1+T+i] optional, T the number of tiers: tier i's live limit, a
--            string set by an operator (SetLimit); when present it
--            replaces ARGV[2i] from the next window on (read only)
--
-- Returns {granted, delay_us, remaining, reset_us, limit}, the last three
-- for the tier with the fewest permits left. Denied: delay_us is when
-- every full tier's window has ended (or the pause); granted 2: n is
-- above some tier's limit in force and can never pass in this window. A
-- sixth element is the permits granted; a seventh, when granted, the wait
-- for one more permit after them (0 if one is free at once).
--
-- Guarantee: for each tier, at most limit permits per aligned window; all
-- tiers or none are charged, and a denied call charges nothing.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[1])
local upTo = n < 0
if upTo then n = -n end

local pause = redis.call('PTTL', KEYS[1])
if pause > 0 then
  return {0, pause * 1000, -1, pause * 1000, 0, 0}
end

local T = (#ARGV - 1) / 2
local fresh, starts, ends, limits, counts = {}, {}, {}, {}, {}
for i = 2, T + 1 do
  local limit = tonumber(ARGV[2 * (i - 1)])
  local len = tonumber(ARGV[2 * (i - 1) + 1])
  local ws = now - math.fmod(now, len)
  local h = redis.call('HMGET', KEYS[i], 'w', 'c', 'l')
  local c = 0
  if h[1] and tonumber(h[1]) == ws then
    c = tonumber(h[2]) or 0
    limit = tonumber(h[3]) or limit
  else
    fresh[i] = true
    if KEYS[T + i] then
      limit = tonumber(redis.call('GET', KEYS[T + i]) or limit) or limit
    end
  end
  starts[i], ends[i], limits[i], counts[i] = ws, ws + len, limit, c
  if upTo and limit - c < n then n = limit - c end
end
if n < 1 then n = 1 end

local ok, delay, never = true, 0, false
local best, bestReset, bestLimit = nil, 0, 0
for i = 2, T + 1 do
  local limit, c, we = limits[i], counts[i], ends[i]
  local rem = limit - c
  if c + n > limit then
    ok = false
    if n > limit then never = true end
    if we - now > delay then delay = we - now end
  else
    rem = rem - n
  end
  if best == nil or rem < best then
    best, bestReset, bestLimit = rem, we - now, limit
  end
end

if not ok then
  if best < 0 then best = 0 end
  if never and not upTo then return {2, delay, best, bestReset, bestLimit, 0} end
  return {0, delay, best, bestReset, bestLimit, 0}
end

local nxt = 0
for i = 2, T + 1 do
  if fresh[i] then
    redis.call('HSET', KEYS[i], 'w', string.format('%.0f', starts[i]), 'c', n, 'l', limits[i])
    redis.call('PEXPIRE', KEYS[i], math.ceil((ends[i] - now) / 1000))
  else
    redis.call('HINCRBY', KEYS[i], 'c', n)
  end
  if counts[i] + n >= limits[i] and ends[i] - now > nxt then nxt = ends[i] - now end
end
return {1, 0, best, bestReset, bestLimit, n, nxt}
