-- slots_release.lua: give a slot of a Concurrency cap back, or leave its
-- queue. Runs after slots_common.lua (KEYS[1..6], ARGV[1..4] as there).
--
-- ARGV[5]  member leaving
--
-- Returns {generation}. Idempotent: a member that holds nothing and
-- waits nowhere changes nothing. A waiter that gives up at the moment it
-- was promoted thus gives the slot straight back. The member is marked gone for two
-- leases (members are never reused): a renewal or a Hold of it still on
-- its way changes nothing when it lands.
local me = ARGV[5]
local gen = generation()
redis.call('ZADD', KEYS[5], now + 2 * lease, me)
redis.call('ZREM', KEYS[1], me)
redis.call('ZREM', KEYS[2], me)
redis.call('ZREM', KEYS[3], me)
tidy()
promote()
keep()
publish()
return {gen}
