-- counter_take.lua: count n calls against a counter that a Resetter zeroes.
--
-- KEYS[1]  counter: a string, calls counted since the last reset; its
--          expiry is the next reset. Only counter_reset.lua creates it.
-- KEYS[2]  pause key of the budget (see pause.lua)
-- ARGV[1]  n, permits asked (integer ≥ 1), all or nothing. A negative
--          value -k asks for up to k (coalesced callers): as many as are
--          left, from 1 to k.
-- ARGV[2]  limit per reset
--
-- Returns {status, delay_ms, remaining, reset_ms}:
--   status 1: granted. status 0: denied, delay_ms = time to the next reset
--   (or the pause's end). status 2: the reset is due and no Resetter has
--   done it yet: ask again shortly. A fifth element is the permits
--   granted.
--
-- Guarantee: at most limit per reset. It checks before it counts, so a
-- denied call counts nothing and never eats into the next period.
local n = tonumber(ARGV[1])
local upTo = n < 0
if upTo then n = -n end
local limit = tonumber(ARGV[2])
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then
  return {0, pause, -1, pause, 0}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  return {2, 0, 0, 0, 0}
end
local c = tonumber(redis.call('GET', KEYS[1])) or 0
if upTo and limit - c < n then n = limit - c end
if n < 1 or c + n > limit then
  return {0, ttl, limit - c, ttl, 0}
end
c = redis.call('INCRBY', KEYS[1], n)
return {1, ttl, limit - c, ttl, n}
