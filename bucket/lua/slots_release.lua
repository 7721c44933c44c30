-- slots_release.lua: give a slot of a Concurrency cap back, or leave its
-- queue. Runs after slots_common.lua (KEYS[1..4], ARGV[1..3] as there).
--
-- ARGV[4]  member leaving
--
-- Returns 1. Idempotent: a member that holds nothing and waits nowhere
-- changes nothing. A waiter that gives up at the moment it was promoted
-- thus gives the slot straight back.
local me = ARGV[4]
redis.call('ZREM', KEYS[1], me)
redis.call('ZREM', KEYS[2], me)
redis.call('ZREM', KEYS[3], me)
tidy()
promote()
keep()
publish()
return 1
