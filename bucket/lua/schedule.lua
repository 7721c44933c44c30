-- schedule.lua: a key's schedule of permits, the functions tb_take.lua and
-- budget.lua share (the Go side puts this file before each of them).
--
-- Every permit has a place, a time on this server's clock (µs) at which
-- its caller may send, and may still send until MARGIN after it; it
-- counts from its place until INTERVAL after its end (place + MARGIN). A
-- place t is given only while the permits counting at t leave room for
-- it, so a schedule holds at most LIMIT places in any span of INTERVAL +
-- MARGIN, and the sends, each within MARGIN of its place, at most LIMIT in
-- any span of INTERVAL: what a provider counting arrivals sees, whatever
-- the callers' waits, processes or leases.
--
-- A schedule is one list. Element 0: "count tat cur before limit born":
-- count, the permits its entries hold; tat, the pace's next place (µs);
-- cur and before, where the last search stopped (an entry's index, the
-- permits in the entries before it: the next search starts there); limit,
-- the limit of the last write (for State); born, when the schedule began
-- (µs: one started again after Redis lost it has another). Elements 1..:
-- entries "end count", a count of permits whose ends are at most end,
-- in order of end; an entry holds the ends of one slot of INTERVAL/256.
-- The list expires when its last entry stops counting.

local Schedule = {}
Schedule.__index = Schedule

-- openSchedule reads the schedule under key at now (µs) for a limit of
-- interval (µs): entries that stopped counting go (up to 64 a call;
-- each call adds at most one for every permit it places).
local function openSchedule(key, interval, now)
  local s = setmetatable({key = key, interval = interval, now = now,
    grid = math.max(math.floor(interval / 256), 1),
    count = 0, tat = 0, cur = 1, before = 0, stored = {}, added = {}}, Schedule)
  s.head = redis.pcall('LINDEX', key, 0)
  if type(s.head) == 'table' then
    -- Not a list: the previous version's token bucket key (a string
    -- expiring at its period's end), met during an upgrade: read as no
    -- schedule. older is until when its grants may still be sent (spread
    -- over the period), for the caller to count; save replaces the key.
    s.head, s.older = nil, now + math.max(redis.call('PTTL', key), 0) * 1000
  end
  s.limit, s.len = 0, 0
  if s.head then
    local a, b, c, d = string.match(s.head, '(%S+) (%S+) (%S+) (%S+)')
    s.count, s.tat, s.cur, s.before = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
    s.born = tonumber(string.match(s.head, '^%S+ %S+ %S+ %S+ %S+ (%S+)') or '')
    s.len = redis.call('LLEN', key) - 1
  end
  if s.born == nil or s.born <= 0 then s.born = now end -- begun now (or by an older version)
  local gone, dropped = 0, 0
  while gone < 64 do
    local e = s:entry(gone + 1)
    if e == nil or e[1] + interval > now then break end
    gone, dropped = gone + 1, dropped + e[2]
  end
  s.gone, s.count = gone, s.count - dropped
  if s.cur <= gone then s.cur, s.before = gone + 1, 0 else s.before = s.before - dropped end
  if s.len > gone then s.tail = s:entry(s.len) end -- the stored tail
  s.last = s.tail -- the latest end (nil when empty)
  return s
end

-- entry is {end, count} of entry i (stored ones first, then those this
-- call added), nil past the last. Entries are read four at a time, and
-- each once: one read before may have been changed since, and save
-- writes back the tables changed.
function Schedule:entry(i)
  if i > self.len then return self.added[i - self.len] end
  if self.stored[i] == nil then
    local r = redis.call('LRANGE', self.key, i, i + 3)
    for j, v in ipairs(r) do
      if self.stored[i + j - 1] == nil then
        local e, c = string.match(v, '(%S+) (%S+)')
        self.stored[i + j - 1] = {tonumber(e), tonumber(c)}
      end
    end
  end
  return self.stored[i]
end

-- add counts c permits ending at e, merged into the tail's slot, and
-- returns the end they are recorded under (the tail's, when e is before
-- it: see giveBack).
function Schedule:add(e, c)
  local grid = self.grid
  local last = self.last
  self.count = self.count + c
  if last and e <= last[1] then e = last[1] end
  if last and math.floor(e / grid) == math.floor(last[1] / grid) then
    last[1], last[2], last.dirty = e, last[2] + c, true
  else
    self.last = {e, c}
    self.added[#self.added + 1] = self.last
  end
  return e
end

-- find returns the index and the entry {end, count} that counts the
-- permits ending at e (µs) were counted in, the entry of slot
-- floor(e/grid) (entries merge only within a slot, and an entry's end only
-- grows within it); nil when no entry still counting holds that slot.
function Schedule:find(e)
  local slot = math.floor(e / self.grid)
  local lo, hi = self.gone + 1, self.len + #self.added
  while lo <= hi do
    local mid = math.floor((lo + hi) / 2)
    local x = self:entry(mid)
    local k = math.floor(x[1] / self.grid)
    if k == slot then
      if x[1] + self.interval <= self.now then return nil end
      return mid, x
    elseif k < slot then
      lo = mid + 1
    else
      hi = mid - 1
    end
  end
  return nil
end

-- change adds d (negative: takes) to the count of entry x, index i.
function Schedule:change(i, x, d)
  x[2], x.dirty, self.dirty = x[2] + d, true, true
  self.count = self.count + d
  if i < self.cur then self.before = self.before + d end
end

-- earliest is the first time at which need more permits fit under limit:
-- when enough of the counted permits have stopped counting; nil if they
-- never do.
function Schedule:earliest(need, limit)
  local excess = self.count + need - limit
  if excess <= 0 then return self.now end
  if self.before >= excess then self.cur, self.before = self.gone + 1, 0 end
  local restarted = false
  while true do
    local e = self:entry(self.cur)
    if e == nil then
      if restarted then return nil end
      self.cur, self.before, restarted = self.gone + 1, 0, true -- a stale cursor
    elseif self.before + e[2] >= excess then
      return math.max(self.now, e[1] + self.interval)
    else
      self.before, self.cur = self.before + e[2], self.cur + 1
    end
  end
end

-- lost counts limit permits ending at known (µs), the latest end the
-- caller's instance was given, in the schedule born at born (0: unknown),
-- when Redis lost that end (an empty restart, a failover, the key
-- deleted): how many permits it held is unknown. Lost: the schedule ends
-- before known, or was born since (begun again by one that knew nothing).
function Schedule:lost(known, born, limit)
  if known <= 0 or known + self.interval <= self.now then return end
  if self.last == nil or known > self.last[1] or born > 0 and born ~= self.born then
    self:add(known, limit)
  end
end

-- changed reports whether the schedule needs writing back.
function Schedule:changed()
  return self.gone > 0 or #self.added > 0 or self.dirty == true or (self.tail ~= nil and self.tail.dirty == true)
end

-- save writes back what changed (the popped entries, the entries
-- changed, the new ones, the header) and the expiry.
function Schedule:save()
  local key = self.key
  if self.older then redis.call('DEL', key) end
  local hdr = string.format('%d %d %d %d %d %d', self.count, math.ceil(self.tat), self.cur - self.gone, self.before, self.limit, self.born)
  for i, x in pairs(self.stored) do -- before the trim below: indices as read
    if x.dirty and i > self.gone then
      redis.call('LSET', key, i, string.format('%d %d', x[1], x[2]))
    end
  end
  local push = {}
  if not self.head then push[1] = hdr end
  for _, e in ipairs(self.added) do
    push[#push + 1] = string.format('%d %d', e[1], e[2])
  end
  for i = 1, #push, 1000 do -- in chunks: unpack() takes at most 8000 values
    redis.call('RPUSH', key, unpack(push, i, math.min(i + 999, #push)))
  end
  if self.head and self.gone > 0 then
    redis.call('LTRIM', key, self.gone + 1, -1)
    redis.call('LPUSH', key, hdr)
  elseif self.head then
    redis.call('LSET', key, 0, hdr)
  end
  if self.last then
    -- Rounded up, and a millisecond more: Redis sets the expiry on its
    -- clock truncated to the millisecond.
    redis.call('PEXPIRE', key, math.ceil((self.last[1] + self.interval - self.now) / 1000) + 1)
  else
    redis.call('DEL', key) -- nothing counts any more
  end
end

-- reset is the time until the schedule's last permit stops counting.
function Schedule:reset()
  if self.last == nil then return 0 end
  return self.last[1] + self.interval - self.now
end

-- giveBack takes c permits that will not be sent off the entry they were
-- counted in (find: that of e's slot, e their recorded end), never below
-- 0; it returns how many it took off (0 when the entry stopped counting).
function Schedule:giveBack(e, c)
  local i, x = self:find(e)
  if i == nil then return 0 end
  local took = math.min(c, x[2])
  if took > 0 then self:change(i, x, -took) end
  return math.max(took, 0)
end
