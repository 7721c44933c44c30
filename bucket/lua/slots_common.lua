-- slots_common.lua: the part every script of a Concurrency cap shares; it is
-- prepended to slots_hold.lua, slots_release.lua and slots_renew.lua.
--
-- KEYS[1]  holders: sorted set, member → end of its lease (ms, server time);
--          it lives as long as KEYS[6] past the last script (see keep())
-- KEYS[2]  queue: sorted set of waiters, member → arrival number
-- KEYS[3]  waiters' leases: sorted set, member → end of its lease (ms)
-- KEYS[4]  arrival counter (a string)
-- KEYS[5]  members gone: sorted set, member → until when (ms) no script
--          may put it back (see slots_release.lua); and member '!frozen'
--          → until when the cap admits nobody new (see freeze())
-- KEYS[6]  a hash: field g, the cap's generation (see generation());
--          field at, the server time (ms) of the last script on the cap
--          (see silence()); fields end and last, the latest lease end of
--          the holders after that script and its holder (see evicted())
-- ARGV[1]  capacity (integer ≥ 1)
-- ARGV[2]  lease in milliseconds (integer ≥ 1)
-- ARGV[3]  wake-up channel prefix; a member "<instance>:<n>" is woken on
--          channel ARGV[3] .. "<instance>"
-- ARGV[4]  the generation the calling instance was last told, if it was
--          told one within the generation's time to live; "" if not
--
-- tidy() drops holders and waiters whose lease has ended (their process
-- stopped renewing: it died or lost Redis). promote() hands free slots to
-- the oldest waiters, in arrival order; publish() then tells each promoted
-- member's instance, on its channel. A promoted waiter keeps its waiter's
-- lease end, so a waiter that died in the queue holds its slot no longer
-- than its lease.
--
-- Every script begins with generation() (which calls silence()) and ends
-- with keep() then publish(), after its last write: without the channel's
-- rights (Redis 7 gives new users none) only the wake-ups are lost, and
-- instances learn of their promotions from their renewals (slots_renew.lua).
--
-- gone(m) tells that member m has left (released, or gave up): a renewal
-- or a Hold's script of m still on its way at the release must not put it
-- back, or the slot would stay taken by nobody for a lease.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local cap = tonumber(ARGV[1])
local lease = tonumber(ARGV[2])

local function tidy()
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
  -- In chunks: unpack() takes at most 8000 values.
  for i = 1, #dead, 1000 do
    local last = math.min(i + 999, #dead)
    redis.call('ZREM', KEYS[2], unpack(dead, i, last))
    redis.call('ZREM', KEYS[3], unpack(dead, i, last))
  end
end

local function gone(m)
  return redis.call('ZSCORE', KEYS[5], m) ~= false
end

-- freeze() closes the cap to newcomers when Redis has lost live members
-- (restarted empty, a failover that lost writes, leases ended while their
-- process was cut off, or while Redis itself was out): the holders it
-- lost are still in their calls, and their renewals put them back, each
-- within lease/3 of Redis answering again plus its round trip (at most
-- min(lease/3, 1 s)): span. Until then the free slots are not free: no
-- Hold takes one, no waiter is promoted. The first script that can tell
-- of the loss calls it (each of generation(), silence(), evicted(),
-- slots_renew.lua, slots_hold.lua says how it tells). frozen() tells until
-- when (ms), or false.
local third = math.floor(lease / 3)
local span = third + math.min(third, 1000)

local function frozen()
  local f = redis.call('ZSCORE', KEYS[5], '!frozen')
  if f and tonumber(f) > now then
    return tonumber(f)
  end
  return false
end

-- freeze(from) closes it from server time from (ms; now if nil): a
-- freeze whose end has passed changes nothing.
local function freeze(from)
  local till = (from or now) + span + 1
  if till <= now then
    return
  end
  local f = frozen()
  if not f or f < till then
    redis.call('ZADD', KEYS[5], till, '!frozen')
  end
end

-- silence(at) freezes the cap when no script ran on it for longer than
-- span (since at, the last one's server time, nil if unknown) and a
-- holder's lease ended in that silence (a holder's end in (at, now],
-- looked at before tidy() drops it). A live holder renews every lease/3:
-- so long a silence means that Redis did not answer (paused, a failover,
-- the network) or that every process using the cap stopped; the holders
-- whose leases ended in it may be live, cut off in their calls, their
-- renewals on their way. Neither the generation (Redis kept it) nor an
-- instance with nothing in the key (it would take their slots) can tell.
-- A waiter's lease that ended in the silence frees no slot (a waiter
-- holds none; one promoted before it is a holder, in KEYS[1]), and its
-- renewal queues it again. (What it costs: see Concurrency's doc.)
--
-- A shorter silence counts too for a holder whose lease ended at least
-- lease - span after at: its renewal was then due (with its round trip)
-- after the last script, and the silence may have cut it off (late
-- within its allowance, then Redis out until just after the lease's
-- end). A holder whose lease ends sooner (its renewal overdue by more,
-- while others used the cap) is cut off alone: not told.
local function silence(at)
  if not at then
    return
  end
  local from = '(' .. at
  if now - at <= span then
    from = at + lease - span
  end
  if redis.call('ZCOUNT', KEYS[1], from, now) > 0 then
    freeze()
  end
end

-- evicted(e, m) freezes the cap when the holders' key is gone while the
-- last script left a holder (m) whose lease (ending at e) still runs:
-- between scripts, only a release takes holders out (it marks them gone,
-- the previous version's too), so Redis lost the key alone (evicted by a
-- maxmemory policy, deleted) and its live holders with it. Neither the
-- generation (kept) nor silence() (no silence) can tell.
local function evicted(e, m)
  if e and e > now and m and not gone(m) and redis.call('EXISTS', KEYS[1]) == 0 then
    freeze()
  end
end

-- generation() returns the cap's generation, tells from it whether Redis
-- lost the cap since the caller last heard of it, and records the
-- script's time (field at) after silence() looked at the last one's. The
-- first script that finds none creates one, unique (the server's time in
-- µs, then the arrival counter); every reply carries it. It lives
-- max(1 h, 4 leases), far past the other keys' idle expiry (two leases),
-- refreshed by every script, never shortened. An instance passes the one
-- it remembers of the key (ARGV[4]) while it can still be there: a script
-- that then finds none, or another one created less than a freeze ago,
-- knows that Redis lost the cap (restarted empty, a failover that lost the
-- key, keys deleted) while holders of it may be live, and freezes from the
-- generation's creation. An instance that remembers none (new, or idle
-- longer than that) cannot tell: as before the loss, it takes a free slot.
local genTTL = math.max(3600000, 4 * lease)

local function generation()
  local told = ARGV[4]
  local rec = redis.call('HMGET', KEYS[6], 'g', 'at', 'end', 'last')
  local g = rec[1]
  if not g then
    -- Nothing on record: the time of the last script is not known either.
    g = t[1] .. string.format('%06d', tonumber(t[2])) .. '.' .. redis.call('INCR', KEYS[4])
    redis.call('HSET', KEYS[6], 'g', g, 'at', now)
    redis.call('PEXPIRE', KEYS[6], genTTL)
    if told ~= '' then
      freeze()
    end
    return g
  end
  redis.call('HSET', KEYS[6], 'at', now)
  if told ~= '' and told ~= g then
    -- From its creation, never later than now: a generation that the
    -- clock puts in the future (created on a master whose clock was
    -- ahead, before a failover to this one; or garbage) closes the cap
    -- for one span, not until the clock catches up with it.
    local born = tonumber(string.match(g, '^%d+')) -- µs
    freeze(born and math.min(math.floor(born / 1000), now))
  end
  silence(tonumber(rec[2]))
  evicted(tonumber(rec[3]), rec[4])
  if redis.call('PTTL', KEYS[6]) < genTTL then
    redis.call('PEXPIRE', KEYS[6], genTTL)
  end
  return g
end

local woken = {} -- instance → its promoted members, space-separated

local function promote()
  if frozen() then
    return
  end
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

-- keep() records the latest lease end of the holders and its holder (see
-- evicted()), and lets the keys of an idle cap vanish two leases after the
-- last write, when every lease in them has ended; the holders (KEYS[1])
-- stay as long as the record (KEYS[6]), for silence() to find those whose
-- leases ended while Redis was out for longer than two leases. (Holders
-- that all released leave no key.) It never shortens a key's time to live:
-- an instance with a shorter lease (a rolling deploy) cannot make the keys
-- vanish under the holders of a longer one.
local function keep()
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  if #last == 2 then
    redis.call('HSET', KEYS[6], 'end', last[2], 'last', last[1])
  else
    redis.call('HSET', KEYS[6], 'end', 0)
  end
  for i = 1, 5 do
    local ttl = i == 1 and genTTL or 2 * lease
    if redis.call('PTTL', KEYS[i]) < ttl then
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
end
