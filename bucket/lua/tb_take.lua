-- tb_take.lua: take tokens from a token bucket's current period, starting
-- the next period first (the refill) when the current one has ended.
--
-- KEYS[1]  tokens key: a string holding the tokens left in the current
--          period; its expiry is the period's end. Only this script
--          creates it, always with an expiry.
-- KEYS[2]  pause key of the same budget (see pause.lua)
-- KEYS[3]  the refill mutex's key, Redsync's format (only read here: a
--          Redsync user holding it, an operator's tool for example, keeps
--          this script from refilling until it is released)
-- KEYS[4]  the period's limit, written here at each refill; it expires
--          HOLD ms after the period ends, so that the next refill can tell
--          how long ago the previous period ended (HOLD - its PTTL)
-- KEYS[5]  live limit, a string set by an operator (TokenBucket.SetLimit);
--          when present it replaces ARGV[2] from the next refill on
-- KEYS[6]  how much (ms) to lengthen the running period to put it back on
--          the phase before a gap (see below): written by a refill that
--          is not asked to, expiring with that period
-- KEYS[7]  the grant profiles (the sliding bound), one hash. The running
--          period's: per slot k of the server's clock (k =
--          floor(ms·S/period)) the tokens granted in it (field c<k>) and
--          the server time of its latest grant (t<k>). The previous
--          period's, written at each refill from the running one: for
--          each slot from lo to hi (fields lo, hi) the tokens granted in
--          it and in every later slot (s<k>, suffix sums), its latest
--          grant (p<k>) and the total (n); only slots whose latest grant
--          is less than an interval old are kept, the previous profile's
--          too (a period cut short, its tokens key lost, lasts less than
--          an interval: a window reaches back past it). It expires an interval
--          after the running period's end (set at a slot's first grant
--          and whenever the period is lengthened), or, with no grant yet
--          in the running period, when the previous period's last slot
--          is an interval old.
-- ARGV[1]  n, tokens asked (integer ≥ 1): all or nothing. A negative
--          value -k asks for up to k (coalesced callers): any number from
--          1 to k is granted, as many as are left.
-- ARGV[2]  limit: tokens per period (integer ≥ 1)
-- ARGV[3]  period in milliseconds (integer ≥ 1)
-- ARGV[4]  1 when the caller's instance saw the store fail or stall
--          lately: it asks that a period started after a gap keep the
--          phase of the periods before it (see below); 0 otherwise
-- ARGV[5]  the end of the latest period of this budget the caller's
--          instance was told of, in ms on this server's clock (an
--          answer's now_ms + reset_ms); 0 or absent when none is known
--          (see "Lost period" below)
-- ARGV[6]  the pace a Limiter places the period's grants at: the share of
--          the period its places span, in ten-thousandths
--          (throttle.SpreadSpan); 0 or absent for no pace (see "A period
--          behind its pace" below)
--
-- Returns {status, delay_ms, remaining, reset_ms, limit, taken, now_ms}:
--   status 1: granted taken tokens; remaining = tokens left; reset_ms =
--             period left; delay_ms = time until the period ends (when
--             fewer than asked were taken, the others can come then), or
--             until the sliding bound lets one more go when the period
--             has tokens left.
--   status 0: denied; delay_ms = time until the period (or the pause)
--             ends, or, when the period has the tokens but the sliding
--             bound holds them, until enough of the previous period's
--             grants are an interval old; remaining = what could be
--             granted now (0 or more).
--   status 3: the period has ended and someone holds the refill mutex:
--             ask again shortly.
--   status 4: n is above the period's limit (lowered live): it can never
--             fit in this period.
-- limit is the period's limit (0 when unknown); now_ms the server's
-- clock (TIME) in ms.
--
-- Guarantee: at most the period's limit in tokens per refill, and refills
-- at least one period apart on the server's clock: the script refills only
-- when the tokens key has expired, and it runs atomically, so two refills
-- can never land in one period (no lock holder can be paused between the
-- check and the refill; there is nothing between them). All or nothing for
-- n > 0; a denied take changes nothing, so it never consumes tokens of this
-- period or of the next.
--
-- Sliding bound: besides, at most the limit is granted in any span of one
-- interval, (t - period, t] for every t: the end of one period and the
-- start of the next together hold no more than the limit (without it they
-- could hold up to twice the limit). Periods last at least an interval
-- (unless cut short: the refill carries the earlier grants still in the
-- window into the previous profile), so such a span covers at most two
-- consecutive periods, and a take at server time t in a period needs
-- only the previous period's grants: it is granted only if used + n <=
-- limit - held, held being the previous period's grants that may still
-- lie in (t - period, t]. Grants are
-- counted in S slots per interval by server time (KEYS[7]); a slot holds
-- all its grants until its latest is a period old, so the one slot that
-- straddles t - period is counted whole (its earlier grants are held up
-- to 1/S of the interval longer than their own time needs), and a burst at
-- one instant leaves exactly one period later (the span is half open). A
-- refused take is told when enough of them leave (never later than the
-- period's end, as every grant of the previous period lies an interval
-- before it). A coalesced take (n < 0) gets what both bounds leave. The
-- refill turns the running profile into the previous one (suffix sums,
-- in the same hash: a take reads one HMGET of six fields). Cost per
-- grant: that HMGET and two writes to KEYS[7] (three on a slot's first
-- grant); per refill: reading KEYS[7] and writing at most S + 1 slots.
-- Redis
-- losing the profiles (an empty restart, a failover to a replica without
-- them) leaves only the period's bound for the first period after: at
-- most the limit more in one span, once per loss; the lost period's hold
-- (below) keeps the tokens at 0 meanwhile.
--
-- Phase after an outage: while the store was paused or down the fleet kept
-- calling the provider (local shares) on the phase of the periods before,
-- and a provider counting its own periods or seconds is on that phase too.
-- The first refill after the outage starts a period at an arbitrary phase
-- (often a caller queued in the paused server's connections refills it,
-- unaware of the outage). A period that starts within the last tenth of
-- one of the old phase puts its burst of grants across the provider's
-- boundary, on top of the next period's. When a caller that saw the
-- outage (ARGV[4] = 1) meets such a period (it refills it, or KEYS[6] says
-- it was refilled after a gap), the period is lengthened to end on the
-- old phase: at the previous period's end plus a whole number of periods.
-- Lengthening never adds a token, keeps refills at least one period apart
-- and costs at most a tenth of a period's grants. Periods that start
-- further from an old boundary keep their phase: their bursts fall
-- within the provider's periods. A gap longer than HOLD starts afresh.
--
-- Lost period: Redis restarted empty (or a promoted replica that had not
-- received the latest refill, or keys deleted by hand) has no tokens key
-- although the fleet was told of a period that is still running, whose
-- grants reached the provider. A refill now would give a whole period's
-- tokens inside it and start the periods at a new phase. When the caller
-- knows a period that ends later than 1 ms from now on this server's
-- clock (ARGV[5]; a take that was delayed on its way here carries an end
-- that has passed, which holds nothing) and the server has no record of
-- it (no KEYS[4]; or KEYS[4] of a period that ended more than half a
-- period before the caller's; or of one still running, its tokens key
-- lost), the script starts no period: it holds the tokens at 0 until the
-- later of the two ends. What the lost period had granted is unknown, so
-- nothing more is granted in it; the cost is at most one period's grants,
-- once per loss and key. The ends are on the clock of the server that
-- answered: after a failover (or a Cluster slot's move), a server whose
-- clock is X ms behind (ahead) holds X ms longer (shorter), and one more
-- than half a period behind holds even when nothing was lost, X ms at
-- most; no hold lasts longer than a lengthened period (ARGV[5] is
-- clamped). The next refill starts on the old phase when a caller asks
-- at the hold's end (callers refused by it are told that end).
--
-- A period behind its pace: a Limiter places the grant with b tokens
-- granted before it in a period of limit L at b/L of PACE of the period
-- from its start (its end less the period) and spreads a crowd's grants
-- that way. A crowd that comes when the period's count is behind those
-- places (an earlier fleet on the same key started it and used a few
-- tokens: the new fleet starts late in it) would find its places passed
-- and take the period's tokens at once, and the next period's first
-- grants would follow them within one period: up to twice the limit in a
-- provider's sliding window. So a grant of a running period that is late
-- (its place before now) lengthens the period to end one period after
-- the start that puts that place at now: the period's remaining tokens
-- are then placed from now on as in a fresh period, and the next period
-- starts one period after that start. A take of one token counts its
-- place over the whole period instead (b/L of it), and lengthens the
-- period only to put that place at now: callers paced evenly at the
-- limit's rate (an adaptive rate), one at a time, are that late (up to
-- the twentieth of the period PACE leaves free at its end), and a period
-- lengthened to PACE would stop them for that long at its end; a crowd
-- whose takes are single (one caller of a process at a time) then has
-- at most a twentieth of the tokens granted before it (b/L less b/L of
-- PACE) go at once. A take of several (a process's crowd, coalesced)
-- puts its place at now. A period only ever grows, and at most to a
-- period from now; grants at or ahead of the pace (a crowd since the
-- period's start) change nothing.
local HOLD = 60000
local period = tonumber(ARGV[3])
local aware = ARGV[4] == '1'
local known = tonumber(ARGV[5] or '0') or 0
local pace = tonumber(ARGV[6] or '0') or 0
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- No period runs further ahead than a lengthened one: an end beyond that
-- (another server's clock, ahead of this one) holds at most that long.
known = math.min(known, now + period + math.floor(period / 10))
-- realign is how much a period that started gap ms after the previous one
-- ended must be lengthened to end on the old phase: 0 unless it started
-- within the last tenth of an old period.
local function realign(gap)
  local shift = gap % period
  if shift == 0 or period - shift > math.floor(period / 10) then
    return 0
  end
  return period - shift
end
-- Sliding bound (see above): S slots per interval, slot of a time in ms.
local S = 50
local function slot(ms)
  return math.floor(ms * S / period)
end
local function field(prefix, k)
  return prefix .. string.format('%d', k)
end
-- shift makes the running period's profile the previous one: the refill.
-- It returns how many grants it kept: all lie in (now - period, now], so
-- that is what held() would read now, but the refilling take must not
-- read it back: the expiry set here is when the latest kept grant leaves
-- the window, as little as 1 ms away, and Redis judges a new expiry on
-- its own clock read inside PEXPIRE (later than TIME above): when that
-- clock has reached it (a millisecond boundary passing inside the
-- command is enough), the key is deleted at once, while this script's
-- window still holds those grants. Later takes read TIME after that
-- clock, so for them the kept grants have left.
local function shift()
  local all = redis.call('HGETALL', KEYS[7])
  if #all == 0 then return 0 end
  redis.call('DEL', KEYS[7]) -- the previous period's profile goes too
  local count, last, sums, prev = {}, {}, {}, {}
  local lo, hi, top
  for i = 1, #all, 2 do
    local kind = string.sub(all[i], 1, 1)
    local k = tonumber(string.sub(all[i], 2))
    local v = tonumber(all[i + 1])
    if k and v then
      if kind == 'c' then
        count[k] = v
      elseif kind == 't' then
        last[k] = v
      elseif kind == 's' then
        sums[k] = v
      elseif kind == 'p' then
        prev[k] = v
      end
    end
  end
  -- The previous period's grants still in the window stay in it: a
  -- period cut short (its tokens key lost) lasts less than an interval,
  -- and a window from the new period reaches back past it.
  for k, t in pairs(prev) do
    local c = (sums[k] or 0) - (sums[k + 1] or 0)
    if t > now - period and c > 0 then
      count[k] = (count[k] or 0) + c
      if last[k] == nil or last[k] < t then last[k] = t end
    end
  end
  for k, t in pairs(last) do
    if t > now - period and (count[k] or 0) > 0 then
      if lo == nil or k < lo then lo = k end
      if hi == nil or k > hi then hi = k end
      if top == nil or t > top then top = t end
    end
  end
  if lo == nil then return 0 end
  local args, sum = {}, 0
  for k = hi, lo, -1 do
    local t = last[k]
    if t ~= nil and t > now - period then
      sum = sum + (count[k] or 0)
      args[#args + 1] = field('p', k)
      args[#args + 1] = t
    end
    args[#args + 1] = field('s', k)
    args[#args + 1] = sum
  end
  args[#args + 1] = 'lo'
  args[#args + 1] = lo
  args[#args + 1] = 'hi'
  args[#args + 1] = hi
  args[#args + 1] = 'n'
  args[#args + 1] = sum
  redis.call('HSET', KEYS[7], unpack(args))
  redis.call('PEXPIRE', KEYS[7], top + period - now)
  return sum
end
-- held is how many of the previous period's grants may still lie in
-- (now - period, now].
local edge = slot(now - period) -- the slot that straddles the window's start
local function held()
  local r = redis.call('HMGET', KEYS[7], 'lo', 'hi', 'n', field('p', edge), field('s', edge), field('s', edge + 1))
  local lo, hi = tonumber(r[1]), tonumber(r[2])
  if lo == nil or hi == nil or edge > hi then return 0 end
  if edge < lo then return tonumber(r[3]) or 0 end
  local t = tonumber(r[4])
  if t ~= nil and t > now - period then return tonumber(r[5]) or 0 end
  return tonumber(r[6]) or 0
end
-- release is how long (ms) until at most most of the previous period's
-- grants lie in the window; 0 when that is already so.
local function release(most)
  local r = redis.call('HGETALL', KEYS[7])
  local f = {}
  for i = 1, #r, 2 do f[r[i]] = tonumber(r[i + 1]) end
  local lo, hi = f['lo'], f['hi']
  if lo == nil or hi == nil then return 0 end
  for k = math.max(edge, lo), hi do
    local t = f[field('p', k)]
    if t ~= nil and t > now - period and (f[field('s', k + 1)] or 0) <= most then
      return t + period - now
    end
  end
  return 0
end
local n = tonumber(ARGV[1])
local upTo = n < 0
if upTo then n = -n end
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then
  return {0, pause, -1, pause, 0, 0, now}
end
local ttl = redis.call('PTTL', KEYS[1])
-- prior: the previous period's grants that may lie in (now - period,
-- now], read before this script sets an expiry on KEYS[7] (see shift).
local left, cap, prior
if ttl < 0 then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    return {3, 0, 0, 0, 0, 0, now}
  end
  cap = tonumber(ARGV[2])
  cap = tonumber(redis.call('GET', KEYS[5]) or cap) or cap
  ttl = period
  local was = redis.call('PTTL', KEYS[4])
  if known > now + 1 then
    local recorded = nil -- the end of the last period on record
    if was >= 0 then recorded = now + was - HOLD end
    if recorded == nil or known - recorded > period / 2 or recorded > now + 1 then
      local hold = known - now
      if recorded ~= nil and recorded > known then hold = recorded - now end
      redis.call('SET', KEYS[1], 0, 'PX', hold)
      redis.call('SET', KEYS[4], cap, 'PX', hold + HOLD)
      return {0, hold, 0, hold, cap, 0, now}
    end
  end
  if was >= 0 and was <= HOLD then
    local longer = realign(HOLD - was)
    if longer > 0 and aware then
      ttl = ttl + longer
    elseif longer > 0 then
      redis.call('SET', KEYS[6], longer, 'PX', ttl)
    end
  end
  redis.call('SET', KEYS[4], cap, 'PX', ttl + HOLD)
  redis.call('SET', KEYS[1], cap, 'PX', ttl)
  prior = shift()
  left = cap -- the refilling caller's tokens are taken below
else
  left = tonumber(redis.call('GET', KEYS[1])) or 0
  cap = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
  if left > 0 then prior = held() end
  if aware then
    local longer = tonumber(redis.call('GET', KEYS[6]) or '')
    if longer then
      redis.call('DEL', KEYS[6])
      ttl = ttl + longer
      redis.call('PEXPIRE', KEYS[1], ttl)
      redis.call('PEXPIRE', KEYS[4], ttl + HOLD)
      redis.call('PEXPIRE', KEYS[7], ttl + period) -- an interval past the new end
    end
  end
end
-- What the sliding bound leaves of the period's tokens.
local free = left
if left > 0 then free = left - prior end
local take = n
if upTo and free < n then take = free end
if take >= 1 and free >= take then
  local used = cap - left -- granted before in the period
  if pace > 0 and cap > 0 and used > 0 then
    -- A period behind its pace (see above): the end that puts this
    -- grant's place at now (over the whole period, for one token).
    local span = pace
    if n == 1 then span = 10000 end
    local due = period - math.floor(used * period * span / (cap * 10000))
    if due > ttl then
      ttl = due
      redis.call('PEXPIRE', KEYS[1], ttl)
      redis.call('PEXPIRE', KEYS[4], ttl + HOLD)
      redis.call('PEXPIRE', KEYS[7], ttl + period) -- an interval past the new end
    end
  end
  left = redis.call('DECRBY', KEYS[1], take)
  local k = slot(now)
  if redis.call('HINCRBY', KEYS[7], field('c', k), take) == take then
    redis.call('PEXPIRE', KEYS[7], ttl + period) -- the slot's first grant
  end
  redis.call('HSET', KEYS[7], field('t', k), now)
  -- When fewer were taken than asked, the others can come when the
  -- period ends or, if it has tokens left, when the window lets one go.
  local delay = ttl
  if take < n and left >= 1 then
    local wait = release(left - 1)
    if wait > 0 then delay = wait end
  end
  return {1, delay, left, ttl, cap, take, now}
end
if not upTo and cap > 0 and n > cap then
  return {4, ttl, left, ttl, cap, 0, now}
end
local need = 1
if not upTo then need = n end
if left >= need then
  -- The period has the tokens; the sliding bound holds them until enough
  -- of the previous period's grants are an interval old.
  local wait = release(left - need)
  if wait > 0 then
    return {0, wait, math.max(free, 0), ttl, cap, 0, now}
  end
end
return {0, ttl, math.max(free, 0), ttl, cap, 0, now}
