-- slots_hold.lua: take a slot of a Concurrency cap, or join its queue.
-- Runs after slots_common.lua (KEYS[1..4], ARGV[1..3] as there).
--
-- ARGV[4]  member asking: "<instance>:<n>", unique per Hold
-- ARGV[5]  "try": take a slot only if one is free now and nobody waits;
--          "wait": else join the queue (or stay in it)
--
-- Returns {1, 0} when the member holds a slot (its lease ends lease ms from
-- now, or earlier if it was promoted from the queue), {0, -1} when "try"
-- found none, {0, ms} when the member waits in the queue: ms is how long
-- until the earliest holder's lease ends, the latest time to look again if
-- no wake-up comes.
--
-- Guarantee: at most ARGV[1] members hold a slot at once (counting only
-- unexpired leases, on the server's clock); a member joins the queue behind
-- every member already in it, and a free slot goes to the queue's head.
local me = ARGV[4]
tidy()
promote()
local function done(r)
  keep()
  publish()
  return r
end
if redis.call('ZSCORE', KEYS[1], me) then
  return done({1, 0})
end
if not redis.call('ZSCORE', KEYS[2], me) then
  -- promote() left a slot free only if nobody waits.
  if redis.call('ZCARD', KEYS[1]) < cap then
    redis.call('ZADD', KEYS[1], now + lease, me)
    return done({1, 0})
  end
  if ARGV[5] == 'try' then
    return done({0, -1})
  end
  redis.call('ZADD', KEYS[2], redis.call('INCR', KEYS[4]), me)
  redis.call('ZADD', KEYS[3], now + lease, me)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local wait = lease
if #first == 2 then
  wait = math.max(tonumber(first[2]) - now, 0) + 1
end
return done({0, wait})
