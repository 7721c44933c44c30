-- tb_giveback.lua: give back permits of a token bucket that will not be
-- sent (after schedule.lua): a caller that left before its place, or woke
-- too late to use it.
--
-- Guarantee: the schedule loses only permits no call was made for, so
-- schedule.lua's bound holds for the calls; it takes off at most what the
-- entry holds.
--
-- KEYS[1]  the key's schedule (schedule.lua)
-- ARGV[1]  interval, µs
-- ARGV[2]  the permits' recorded end, µs (tb_take.lua's reply)
-- ARGV[3]  how many (integer ≥ 1)
-- ARGV[4]  when the schedule they were placed in was born, µs (tb_take.lua's
--          reply); 0 for unknown
--
-- Returns how many were given back.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local s = openSchedule(KEYS[1], tonumber(ARGV[1]), now)
if s.older then return 0 end -- the previous version's key: nothing of ours to give back
local born, took = tonumber(ARGV[4] or '0'), 0
-- Not in the schedule they were placed in (Redis lost it), an entry of
-- the same slot holds other permits: nothing is given back.
if born <= 0 or born == s.born then took = s:giveBack(tonumber(ARGV[2]), tonumber(ARGV[3])) end
if s:changed() then s:save() end
return took
