-- slots_renew.lua: extend the leases of one instance's holders and
-- waiters of a Concurrency cap. Runs after slots_common.lua (KEYS[1..4],
-- ARGV[1..3] as there).
--
-- ARGV[4]    n, how many of the members that follow hold a slot
-- ARGV[5..]  the members to renew: n holders, then waiters
--
-- Returns the waiters among them that hold a slot after the script: those
-- promoted since they last looked, whose wake-up may not have come (lost,
-- or no channel rights).
--
-- A holder's lease is extended, and a holder Redis no longer has (it
-- restarted empty, a failover lost the write, or its lease ended while
-- its process was cut off) is put back: its call is still running, and
-- the cap must count it. A waiter Redis no longer has joins the queue
-- again, at its end. The instance never renews a member that has left
-- (released, or gave up), nor one whose Hold has not had its first reply.
-- The renewal also tidies and promotes, so the slot of a dead holder goes
-- to the queue's head within one renewal period of its lease's end, even
-- with no other activity.
tidy()
local n = tonumber(ARGV[4])
for i = 5, #ARGV do
  local m = ARGV[i]
  if i < 5 + n or redis.call('ZSCORE', KEYS[1], m) then
    redis.call('ZADD', KEYS[1], now + lease, m)
  elseif redis.call('ZSCORE', KEYS[2], m) then
    redis.call('ZADD', KEYS[3], now + lease, m)
  else
    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), m)
    redis.call('ZADD', KEYS[3], now + lease, m)
  end
end
promote()
local holding = {}
for i = 5 + n, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    holding[#holding + 1] = ARGV[i]
  end
end
keep()
publish()
return holding
