-- slots_renew.lua: extend the leases of one instance's holders and
-- waiters of a Concurrency cap. Runs after slots_common.lua (KEYS[1..4],
-- ARGV[1..3] as there).
--
-- ARGV[4..]  members to renew
--
-- Returns how many leases it extended. A member whose lease
-- had already ended is not brought back. The renewal also tidies and
-- promotes, so the slot of a dead holder goes to the queue's head within
-- one renewal period of its lease's end, even with no other activity.
tidy()
local alive = 0
for i = 4, #ARGV do
  local m = ARGV[i]
  alive = alive + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, m)
  alive = alive + redis.call('ZADD', KEYS[3], 'XX', 'CH', now + lease, m)
end
promote()
keep()
return alive
