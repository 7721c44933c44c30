-- counter_reset.lua: a Resetter's reset of a counter, fenced.
--
-- KEYS[1]  counter (see counter_take.lua)
-- ARGV[1]  period in milliseconds (integer ≥ 1)
--
-- Returns the milliseconds until the next reset is due: ARGV[1] when it
-- reset the counter now, or what is left of the current period when the
-- period has not ended (someone else reset it).
--
-- Guarantee (the fence): the counter is zeroed only once its period has
-- ended on the server's clock, so two resetters that both believe they
-- lead can never reset twice in one period. Resets are at least one
-- period apart.
local ttl = redis.call('PTTL', KEYS[1])
if ttl >= 0 then
  return ttl
end
redis.call('SET', KEYS[1], '0', 'PX', ARGV[1])
return tonumber(ARGV[1])
