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
--             fewer than asked were taken, the others can come then).
--   status 0: denied; delay_ms = time until the period (or the pause) ends.
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
local n = tonumber(ARGV[1])
local upTo = n < 0
if upTo then n = -n end
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then
  return {0, pause, -1, pause, 0, 0, now}
end
local ttl = redis.call('PTTL', KEYS[1])
local left, cap
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
  local take = n
  if upTo and cap < n then take = cap end
  if take <= cap then
    -- the refilling caller's tokens, taken as the period starts
    redis.call('SET', KEYS[1], cap - take, 'PX', ttl)
    return {1, ttl, cap - take, ttl, cap, take, now}
  end
  redis.call('SET', KEYS[1], cap, 'PX', ttl)
  left = cap
else
  left = tonumber(redis.call('GET', KEYS[1])) or 0
  cap = tonumber(redis.call('GET', KEYS[4]) or '0') or 0
  if aware then
    local longer = tonumber(redis.call('GET', KEYS[6]) or '')
    if longer then
      redis.call('DEL', KEYS[6])
      ttl = ttl + longer
      redis.call('PEXPIRE', KEYS[1], ttl)
      redis.call('PEXPIRE', KEYS[4], ttl + HOLD)
    end
  end
end
local take = n
if upTo and left < n then take = left end
if take >= 1 and left >= take then
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
    end
  end
  left = redis.call('DECRBY', KEYS[1], take)
  return {1, ttl, left, ttl, cap, take, now}
end
if not upTo and cap > 0 and n > cap then
  return {4, ttl, left, ttl, cap, 0, now}
end
return {0, ttl, left, ttl, cap, 0, now}
