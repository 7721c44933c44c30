-- slots_hold.lua: take a slot of a Concurrency cap, or join its queue.
-- Runs after slots_common.lua (KEYS[1..6], ARGV[1..4] as there).
--
-- ARGV[5]  member asking: "<instance>:<n>", unique per Hold
-- ARGV[6]  "try": take a slot only if one is free now and nobody waits;
--          "wait": else join the queue (or stay in it)
-- ARGV[7]  a witness: another member of the asking instance that Redis
--          had told it holds a slot or waits, and that has not left ("":
--          none). If Redis has no record of it, it lost members, and
--          the cap admits nobody new until the renewals put them back
--          (see freeze()): a loss neither the generation nor silence()
--          tells (the member's instance alone cut off from Redis while
--          others used the cap; a failover that lost its write only).
--
-- Returns {generation, 1, 0} when the member holds a slot (its lease ends
-- lease ms from now, or earlier if it was promoted from the queue),
-- {generation, 0, -1} when "try" found none ({generation, 0, -1, ms} when
-- the cap is closed after a loss, for ms more) or the member has left
-- already (its Hold gave up: nobody reads it), {generation, 0, ms} when the
-- member waits in the queue: ms is how long until the earliest holder's
-- lease ends (or the cap is no longer frozen), the latest time to look
-- again if no wake-up comes.
--
-- Guarantee: at most ARGV[1] members hold a slot at once (counting only
-- unexpired leases, on the server's clock); a member joins the queue behind
-- every member already in it, and a free slot goes to the queue's head.
local me = ARGV[5]
local witness = ARGV[7] or ''
local gen = generation()
tidy()
if witness ~= '' and not gone(witness) and not redis.call('ZSCORE', KEYS[1], witness)
    and not redis.call('ZSCORE', KEYS[2], witness) then
  freeze()
end
promote()
local function done(r)
  keep()
  publish()
  return {gen, r[1], r[2], r[3]}
end
if gone(me) then
  -- a script of a Hold that gave up, landing after its leave: no caller
  -- waits for it
  return done({0, -1})
end
if redis.call('ZSCORE', KEYS[1], me) then
  return done({1, 0})
end
if not redis.call('ZSCORE', KEYS[2], me) then
  -- promote() left a slot free only if nobody waits.
  if not frozen() and redis.call('ZCARD', KEYS[1]) < cap then
    redis.call('ZADD', KEYS[1], now + lease, me)
    return done({1, 0})
  end
  if ARGV[6] == 'try' then
    local f = frozen()
    if f then
      return done({0, -1, f - now + 1})
    end
    return done({0, -1})
  end
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), me)
  redis.call('ZADD', KEYS[3], now + lease, me)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = lease
local f = frozen()
if f then
  wait = f - now + 1 -- nothing is handed out before
elseif #first == 2 then
  wait = math.max(tonumber(first[2]) - now, 0) + 1
end
return done({0, wait})
