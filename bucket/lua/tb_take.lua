-- tb_take.lua: take n tokens from a token bucket's current period.
--
-- KEYS[1]  tokens key: a string holding the tokens left in the current
--          period; its expiry is the period's end. Only tb_refill.lua
--          creates it, always with an expiry.
-- KEYS[2]  pause key of the same budget (see pause.lua)
-- KEYS[3]  the refill mutex's key (Redsync's; only read here)
-- KEYS[4]  optional: the period's limit, written by tb_refill.lua with
--          the tokens' expiry (only read here)
-- ARGV[1]  n, tokens asked (integer ≥ 1)
--
-- Returns {status, delay_ms, remaining, reset_ms}:
--   status 1: granted; remaining = tokens left; reset_ms = period left.
--   status 0: denied; delay_ms = time until the period (or the pause) ends.
--   status 2: the period has ended (key absent, or without expiry) and no
--             one holds the refill mutex: take it, run tb_refill.lua.
--   status 3: the period has ended and someone holds the refill mutex:
--             ask again shortly.
--   status 4: n is above the period's limit (lowered live): it can never
--             fit in this period.
-- Statuses 0, 1 and 4 add a fifth element: the period's limit (0 when
-- unknown).
--
-- Guarantee: all or nothing. A denied take changes nothing, so it never
-- consumes tokens of this period or of the next; the key is never
-- re-created without an expiry.
local n = tonumber(ARGV[1])
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then
  return {0, pause, -1, pause}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    return {3, 0, 0, 0}
  end
  return {2, 0, 0, 0}
end
local left = tonumber(redis.call('GET', KEYS[1])) or 0
local cap = 0
if KEYS[4] then
  cap = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
end
if left >= n then
  left = redis.call('DECRBY', KEYS[1], n)
  return {1, 0, left, ttl, cap}
end
if cap > 0 and n > cap then
  return {4, ttl, left, ttl, cap}
end
return {0, ttl, left, ttl, cap}
