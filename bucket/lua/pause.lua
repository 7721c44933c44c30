-- pause.lua: hold one budget for the whole fleet until a time.
--
-- KEYS[1]  pause key of the budget (a string; its expiry is the pause's end)
-- ARGV[1]  pause length in milliseconds (integer ≥ 1)
--
-- Returns 1 when the pause was set or lengthened, 0 when a longer pause was
-- already running.
--
-- Guarantee: a shorter pause never shortens a longer one; the pause ends on
-- the server's clock.
local d = tonumber(ARGV[1])
if redis.call('PTTL', KEYS[1]) < d then
  redis.call('SET', KEYS[1], '1', 'PX', d)
  return 1
end
return 0
