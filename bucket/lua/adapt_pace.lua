-- adapt_pace.lua: one evenly spaced slot at a budget's adaptive rate.
--
-- KEYS[1]  adaptive state of the budget: a hash (see adapt_swap.lua);
--          this script keeps one field of its own there, tr: the rate in
--          thousandths the slots up to KEYS[2] were reserved at
-- KEYS[2]  next free slot: a string, µs since the Unix epoch on the
--          server's clock; expires once the slot is past
-- ARGV[1]  n, slots asked (integer ≥ 1)
-- ARGV[2]  the bucket's interval in µs (≥ 1): the rate is per interval
-- ARGV[3]  horizon in µs (≥ 0): reserve only a slot at most this far ahead
--
-- Returns {code, delay_us, now_us, state...} where state is the hash's
-- fields r, c, p, s, d, i, x, v (see adapt_swap.lua), 0 when absent:
--   code 2: no adaptive state: nothing paced, nothing changed.
--   code 1: n slots reserved, the first delay_us from now (0: now).
--   code 0: the first free slot is delay_us away, beyond the horizon;
--           nothing changed.
--
-- Guarantee: while the state exists, slots are at least interval / rate
-- apart on the server's clock (burst 1), whichever instance takes them.
-- When the rate has changed since the last slot was reserved, the next
-- free slot is one new spacing after that last slot (tat less one old
-- spacing): a slot reserved at a permit per hour does not hold the fleet
-- for an hour once the rate is back up, and no slot comes closer to the
-- last one than the new spacing. Slots reserved earlier keep their times.
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
local tat = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local old = tonumber(redis.call('HGET', KEYS[1], 'tr') or '0') or 0
if old > 0 and old ~= out[4] and tat > now then
  tat = tat - math.ceil(tonumber(ARGV[2]) * 1000 / old) + em
end
if tat < now then tat = now end
local wait = tat - now
out[2] = wait
if wait > tonumber(ARGV[3]) then
  return out
end
local new = tat + n * em
redis.call('SET', KEYS[2], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1)
redis.call('HSET', KEYS[1], 'tr', out[4])
out[1] = 1
return out
