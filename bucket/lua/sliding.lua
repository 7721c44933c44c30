-- sliding.lua: a sliding-window log over one or more windows.
--
-- KEYS[1]    log: a sorted set of granted permits, score = grant time (µs
--            since the Unix epoch, server's TIME), member unique
-- KEYS[2]    pause key of the budget (see pause.lua)
-- ARGV[1]    n, permits asked (integer ≥ 1), all or nothing. A negative
--            value -k asks for up to k (coalesced callers): as many as
--            every window has room for, from 1 to k.
-- ARGV[2]    nonce, unique per call (makes members unique)
-- ARGV[3]    the longest window in microseconds
-- ARGV[2+2i] window i's limit (integer ≥ 1)
-- ARGV[3+2i] window i's length in microseconds
--
-- An entry with score s counts in a window of length w while now - w < s.
-- Entries older than the longest window are trimmed; the key expires after
-- the longest window.
--
-- Returns {granted, delay_us, remaining, reset_us, limit}, the last three
-- for the window with the fewest permits left. Denied: delay_us is when
-- enough of the oldest entries have left every full window. A sixth
-- element is the permits granted; a seventh, when granted, the wait for
-- one more permit after them (0 if one is free at once).
--
-- Guarantee: in every window, at most limit permits granted within any
-- span of its length. A denied call logs nothing and charges nothing.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = tonumber(ARGV[1])
local upTo = n < 0
if upTo then n = -n end
local longest = tonumber(ARGV[3])

local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then
  return {0, pause * 1000, -1, pause * 1000, 0, 0}
end

local function f(x) return string.format('%.0f', x) end

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', f(now - longest))

local counts = {}
for i = 4, #ARGV, 2 do
  counts[i] = redis.call('ZCOUNT', KEYS[1], '(' .. f(now - tonumber(ARGV[i + 1])), '+inf')
  if upTo then
    local room = tonumber(ARGV[i]) - counts[i]
    if room < n then n = room end
  end
end
if n < 1 then n = 1 end

local ok, delay = true, 0
local best, bestLen, bestLimit = nil, 0, 0
for i = 4, #ARGV, 2 do
  local limit = tonumber(ARGV[i])
  local len = tonumber(ARGV[i + 1])
  local from = '(' .. f(now - len)
  local c = counts[i]
  local rem = limit - c
  if c + n > limit then
    ok = false
    -- the (c+n-limit)-th oldest entry of the window must leave first
    local e = redis.call('ZRANGEBYSCORE', KEYS[1], from, '+inf', 'WITHSCORES', 'LIMIT', c + n - limit - 1, 1)
    local d = tonumber(e[2]) + len - now
    if d > delay then delay = d end
  else
    rem = rem - n
  end
  if best == nil or rem < best then
    best, bestLen, bestLimit = rem, len, limit
  end
end

-- reset: when the oldest entry of the tightest window leaves it
local reset = 0
local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. f(now - bestLen), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
if oldest[2] then reset = tonumber(oldest[2]) + bestLen - now elseif ok then reset = bestLen end

if not ok then
  if best < 0 then best = 0 end
  return {0, delay, best, reset, bestLimit, 0}
end

local score = f(now)
for i = 1, n do
  redis.call('ZADD', KEYS[1], score, score .. ':' .. ARGV[2] .. ':' .. i)
end
redis.call('PEXPIRE', KEYS[1], math.ceil(longest / 1000))
-- one more permit: in each window where c + n + 1 > limit, the
-- (c + n + 1 - limit)-th oldest entry must leave first (one of ours, logged
-- now, when that is beyond the c older ones)
local nxt = 0
for i = 4, #ARGV, 2 do
  local limit, len, c = tonumber(ARGV[i]), tonumber(ARGV[i + 1]), counts[i]
  local idx = c + n + 1 - limit
  if idx >= 1 then
    local d = len
    if idx <= c then
      local e = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. f(now - len), '+inf', 'WITHSCORES', 'LIMIT', idx - 1, 1)
      d = tonumber(e[2]) + len - now
    end
    if d > nxt then nxt = d end
  end
end
return {1, 0, best, reset, bestLimit, n, nxt}
