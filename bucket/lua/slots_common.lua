-- slots_common.lua: the part every script of a Concurrency cap shares; it is
-- prepended to slots_hold.lua, slots_release.lua and slots_renew.lua.
--
-- KEYS[1]  holders: sorted set, member → end of its lease (ms, server time)
-- KEYS[2]  queue: sorted set of waiters, member → arrival number
-- KEYS[3]  waiters' leases: sorted set, member → end of its lease (ms)
-- KEYS[4]  arrival counter (a string)
-- ARGV[1]  capacity (integer ≥ 1)
-- ARGV[2]  lease in milliseconds (integer ≥ 1)
-- ARGV[3]  wake-up channel prefix; a member "<instance>:<n>" is woken on
--          channel ARGV[3] .. "<instance>"
--
-- tidy() drops holders and waiters whose lease has ended (their process
-- stopped renewing: it died or lost Redis). promote() hands free slots to
-- the oldest waiters, in arrival order; publish() then tells each promoted
-- member's instance, on its channel. A promoted waiter keeps its waiter's
-- lease end, so a waiter that died in the queue holds its slot no longer
-- than its lease.
--
-- Every script ends with keep() then publish(), after its last write: a
-- user without the channel's rights (Redis 7 gives new users none) gets
-- no wake-ups, but the script's writes all happen, the keys keep their
-- time to live and the script succeeds. Instances then learn of their
-- promotions from their renewals (slots_renew.lua).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])

local function tidy()
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  -- In chunks: unpack() takes at most 8000 values.
  for i = 1, #dead, 1000 do
    local last = math.min(i + 999, #dead)
    redis.call('ZREM', KEYS[2], unpack(dead, i, last))
    redis.call('ZREM', KEYS[3], unpack(dead, i, last))
  end
end

local woken = {} -- instance → its promoted members, space-separated

local function promote()
  local free = cap - redis.call('ZCARD', KEYS[1])
  while free > 0 do
    local head = redis.call('ZPOPMIN', KEYS[2])
    if #head == 0 then
      break
    end
    local m = head[1]
    local ends = redis.call('ZSCORE', KEYS[3], m) or (now + lease)
    redis.call('ZREM', KEYS[3], m)
    redis.call('ZADD', KEYS[1], ends, m)
    free = free - 1
    local inst = string.match(m, '^[^:]+')
    woken[inst] = (woken[inst] and (woken[inst] .. ' ') or '') .. m
  end
end

-- publish() sends the wake-ups of promote(). pcall: a refused PUBLISH
-- (NOPERM: no rights on the channel) costs the wake-up, not the script.
local function publish()
  for inst, members in pairs(woken) do
    redis.pcall('PUBLISH', ARGV[3] .. inst, members)
  end
end

-- keep() lets the keys of an idle cap vanish two leases after the last
-- write: by then every lease in them has ended. It never shortens a key's
-- time to live, so that an instance with a shorter lease (a rolling
-- deploy) cannot make the keys vanish under the holders of a longer one.
local function keep()
  for i = 1, 4 do
    if redis.call('PTTL', KEYS[i]) < 2 * lease then
      redis.call('PEXPIRE', KEYS[i], 2 * lease)
    end
  end
end
