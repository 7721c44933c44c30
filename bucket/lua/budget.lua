-- budget.lua: take, settle or pause a cost across the dimensions of one
-- budget (requests and tokens per minute, say), all or nothing, in one
-- call (after schedule.lua, which says what a place and a schedule are).
--
-- Each dimension is a schedule. A take places the call at one time for
-- every dimension it names: the earliest at which each has room for its
-- amount, when that is within the wait and at most MARGIN ahead; each
-- records its amount ending at the place plus MARGIN. Costs are not paced
-- (Budget's doc says why, and why a call is not placed further ahead). A
-- settle corrects a grant in the entry it was recorded in (the take
-- returns its end), while that counts: a give-back takes from it, never
-- below 0; a charge adds to it. Once it has stopped counting, a give-back
-- does nothing and a charge counts from now. A pause of a dimension holds
-- the takes naming it; a shorter never shortens a longer.
--
-- Guarantee: schedule.lua's, per dimension: at most LIMIT placed in any
-- span of INTERVAL + MARGIN, net of give-backs; charges come on top, and
-- later places wait for them. A refused take changes nothing but dropping
-- entries that stopped counting (and counting a lost schedule's limit).
--
-- KEYS[1]    pause key of the budget (pause.lua): no place while it lives
-- KEYS[2]    the dimensions' pauses: a hash, name → until (µs)
-- KEYS[2+i]  dimension i's schedule, i = 1..D
-- ARGV[1]    'take', 'settle' or 'pause'
-- ARGV[2]    margin, µs
-- ARGV[3]    for a take, the longest wait for a place, µs; -1 for none
-- ARGV[4+6(i-1)..9+6(i-1)], dimension i: name, limit, interval (µs),
--            amount, the latest end the caller's instance was given there
--            (µs; 0: none; see Schedule:lost), the end a take returned for
--            the grant settled (µs; 0: unknown). The amount: for a take,
--            what it asks (0: not checked); for a settle, the change (> 0
--            charges, < 0 gives back); for a pause, its length (µs).
--
-- Returns {status, delay, now, dim, remaining, reset, end_1, ..., end_D}
-- (µs). Take: status 1, placed at now + delay, end_i where dimension i
-- recorded it (0: not asked); status 0, refused, delay the earliest place
-- or a pause's end, less now. dim (1-based) is the dimension that binds
-- (granted: the one with the least left for its limit; 0: the budget
-- paused), remaining what it has left (-1 in a pause), reset the time
-- until its last place stops counting. Settle, pause: status 1, end_i the
-- entry a charge went to.
local mode, margin, maxWait = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local dims, names, ends = {}, {}, {}
for i = 1, #KEYS - 2 do
  local b = 4 + 6 * (i - 1)
  names[i], ends[i] = ARGV[b], 0
  dims[i] = {limit = tonumber(ARGV[b + 1]), interval = tonumber(ARGV[b + 2]), amount = tonumber(ARGV[b + 3]),
    known = tonumber(ARGV[b + 4]), at = tonumber(ARGV[b + 5])}
end
local function reply(status, delay, dim, remaining, reset)
  return {status, delay, now, dim, remaining, reset, unpack(ends)}
end

if mode == 'pause' then
  local longest = 0
  for i, d in ipairs(dims) do
    if d.amount > 0 and now + d.amount > (tonumber(redis.call('HGET', KEYS[2], names[i])) or 0) then
      redis.call('HSET', KEYS[2], names[i], string.format('%d', now + d.amount))
      longest = math.max(longest, math.ceil(d.amount / 1000))
    end
  end
  if longest > redis.call('PTTL', KEYS[2]) then redis.call('PEXPIRE', KEYS[2], longest) end
  return reply(1, 0, 0, 0, 0)
end

-- open reads the schedules of the dimensions with an amount, each
-- counting the limit at the end the caller knows if Redis lost it.
local function open()
  for i, d in ipairs(dims) do
    if d.amount ~= 0 then
      d.s = openSchedule(KEYS[2 + i], d.interval, now)
      d.s:lost(d.known, 0, d.limit)
    end
  end
end
local function save()
  for _, d in ipairs(dims) do
    if d.s and d.s:changed() then d.s:save() end
  end
end

if mode == 'settle' then
  open()
  for i, d in ipairs(dims) do
    local k, x
    if d.s and d.at > 0 then k, x = d.s:find(d.at) end
    if x and d.amount ~= 0 then
      local c = math.max(d.amount, -x[2]) -- never below 0
      d.s:change(k, x, c)
      if d.amount > 0 then ends[i] = x[1] end
    elseif d.amount > 0 then
      d.s:add(now, d.amount)
      ends[i] = d.s.last[1]
    end
  end
  save()
  return reply(1, 0, 0, 0, 0)
end

local pause = redis.call('PTTL', KEYS[1])
if pause > 0 then return reply(0, pause * 1000, 0, -1, pause * 1000) end
local paused = redis.call('HMGET', KEYS[2], unpack(names))
local held, worst = 0, 0
for i, d in ipairs(dims) do
  local u = tonumber(paused[i]) or 0
  if d.amount > 0 and u - now > held then held, worst = u - now, i end
end
if held > 0 then return reply(0, held, worst, -1, held) end

open()
local p = now
for i, d in ipairs(dims) do
  if d.s then
    local e = d.s:earliest(d.amount, d.limit) or math.huge
    if e > p or worst == 0 then p, worst = math.max(p, e), i end
  end
end
if p == math.huge or p - now > margin or maxWait >= 0 and p - now > maxWait then
  local d = dims[worst]
  if p == math.huge then p = now + d.interval + margin end
  save()
  return reply(0, p - now, worst, math.max(d.limit - d.s.count, 0), d.s:reset())
end
local best, least = 0, math.huge
for i, d in ipairs(dims) do
  if d.s then
    d.s:add(p + margin, d.amount)
    ends[i] = d.s.last[1]
    local left = (d.limit - d.s.count) / d.limit
    if left < least then best, least = i, left end
  end
end
save()
local d = dims[best]
return reply(1, p - now, best, math.max(d.limit - d.s.count, 0), d.s:reset())
