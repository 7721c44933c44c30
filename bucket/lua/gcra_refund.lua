-- gcra_refund.lua: give back permits to a GCRA bucket.
--
-- KEYS[1]  theoretical arrival time (see gcra.lua)
-- ARGV[1]  n, permits given back (integer ≥ 1)
-- ARGV[2]  emission interval in µs
-- KEYS[2]  optional: live limit (see gcra.lua); when present, the emission
--          is ceil(ARGV[3] / limit)
-- ARGV[3]  interval in µs (with KEYS[2])
--
-- Returns 1 when the TAT moved back, 0 when the bucket was already full.
--
-- Guarantee: the TAT never moves before now, so a refund never makes the
-- bucket fuller than full (never more than burst at once).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or 0) or 0
local em = tonumber(ARGV[2])
if KEYS[2] then
  local live = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if live > 0 then em = math.ceil(tonumber(ARGV[3]) / live) end
end
if tat <= now then
  return 0
end
local new = tat - tonumber(ARGV[1]) * em
if new <= now then
  redis.call('DEL', KEYS[1])
  return 1
end
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', math.ceil((new - now) / 1000) + 1)
return 1
