-- slots_renew.lua: extend the leases of one instance's holders and
-- waiters of a Concurrency cap. Runs after slots_common.lua
-- (KEYS[1..6], ARGV[1..4] as there).
--
-- ARGV[5]    n, how many of the members that follow hold a slot
-- ARGV[6..]  the members to renew: n holders, then waiters
--
-- Returns {generation, waiters...}: the waiters among them that hold a
-- slot after the script: those promoted since they last looked, whose
-- wake-up may not have come (lost, or no channel rights).
--
-- A holder's lease is extended; a holder Redis no longer has (it
-- restarted empty, a failover lost the write, or the lease ended while
-- its process was cut off) is put back, as its call still runs, and a
-- waiter Redis no longer has joins the queue again, at its end. Either
-- loss freezes the cap (see freeze()). The instance renews no member that
-- has left, nor one whose Hold has not had its first reply; one released
-- while this renewal was on its way is gone, and skipped. It also tidies
-- and promotes: a dead holder's slot goes to the queue's head within a
-- renewal period of its lease's end, even with no other activity.
local gen = generation()
tidy()
local n = tonumber(ARGV[5])
local lost = false
for i = 6, #ARGV do
  local m = ARGV[i]
  if gone(m) then
    -- released after this renewal was sent: nothing to renew
  elseif redis.call('ZSCORE', KEYS[1], m) then
    redis.call('ZADD', KEYS[1], now + lease, m)
  elseif i < 6 + n then
    lost = true
    redis.call('ZADD', KEYS[1], now + lease, m)
    -- Redis may have it queued (re-queued by a renewal of its time as
    -- a waiter): a holder waits no more, and is never promoted again
    redis.call('ZREM', KEYS[2], m)
    redis.call('ZREM', KEYS[3], m)
  elseif redis.call('ZSCORE', KEYS[2], m) then
    redis.call('ZADD', KEYS[3], now + lease, m)
  else
    lost = true
    redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), m)
    redis.call('ZADD', KEYS[3], now + lease, m)
  end
end
if lost then
  freeze()
end
promote()
local holding = {gen}
for i = 6 + n, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    holding[#holding + 1] = ARGV[i]
  end
end
keep()
publish()
return holding
