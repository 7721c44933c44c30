-- adapt_pace.lua: one evenly spaced slot at a budget's adaptive rate.
--
-- KEYS[1]  adaptive state of the budget: a hash (see adapt_swap.lua)
-- KEYS[2]  next free slot: a string "tat,rate": tat in µs since the Unix
--          epoch on the server's clock, rate the rate in thousandths it
--          was reserved at; expires once the slot is past
-- ARGV[1]  n, slots asked (integer ≥ 1)
-- ARGV[2]  the bucket's interval in µs (≥ 1): the rate is per interval
-- ARGV[3]  horizon in µs (≥ 0): reserve only a slot at most this far ahead
--
-- Returns {code, delay_us, now_us, state...} where state is the hash's
-- fields r, c, p, s (rates in thousandths of a permit per interval),
-- d, i, x (µs since the epoch) and v (version), 0 when absent:
--   code 2: no adaptive state: nothing paced, nothing changed.
--   code 1: n slots reserved, the first delay_us from now (0: now).
--   code 0: the first free slot is delay_us away, beyond the horizon;
--           nothing changed.
--
-- Guarantee: while the state exists, slots are at least interval / rate
-- apart on the server's clock (burst 1), whichever instance takes them.
-- When the rate has changed since the slots ahead were reserved, what is
-- left of them is rescaled to the new rate: slots reserved at a rate of a
-- permit per hour do not hold the fleet for an hour once the rate is back
-- up, nor do slots reserved at a high rate let a burst through after a
-- decrease.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local f = redis.call('HMGET', KEYS[1], 'r', 'c', 'p', 's', 'd', 'i', 'x', 'v')
local out = {0, 0, now}
for k = 1, 8 do out[3 + k] = tonumber(f[k] or '0') or 0 end
local rate = out[4] / 1000
if rate <= 0 then
  out[1] = 2
  return out
end
local n = tonumber(ARGV[1])
local em = math.ceil(tonumber(ARGV[2]) / rate)
local raw = redis.call('GET', KEYS[2]) or '0'
local tatS, oldS = string.match(raw, '^([^,]*),?(.*)$')
local tat = tonumber(tatS) or 0
local old = tonumber(oldS) or 0
if tat < now then
  tat = now
elseif old > 0 and old ~= out[4] then
  tat = now + math.ceil((tat - now) * old / out[4])
end
local wait = tat - now
out[2] = wait
if wait > tonumber(ARGV[3]) then
  return out
end
local new = tat + n * em
redis.call('SET', KEYS[2], string.format('%.0f,%.0f', new, out[4]), 'PX', math.ceil((new - now) / 1000) + 1)
out[1] = 1
return out
