-- tb_take.lua: give permits of a token bucket their places in time.
--
-- Every permit has a place: a time on this server's clock at which its
-- caller may send, and may still send until MARGIN after it. A permit
-- counts from its place until INTERVAL after its end (its place + MARGIN).
-- A new place t is given only while the permits counting at t leave room
-- for it, so a key's places are at most LIMIT in any span of
-- INTERVAL + MARGIN, and the sends, each within MARGIN of its place, at
-- most LIMIT in any span of INTERVAL: what a provider counting arrivals
-- sees, whatever the callers' waits, processes or leases. A burst at an
-- idle key gets the whole limit at once; a caller that can wait for it is
-- paced instead, at INTERVAL/LIMIT per permit after the previous paced
-- place (tat), so that a crowd goes at the limit's pace, not in bursts.
--
-- KEYS[1]  the key's schedule, a list. Element 0: "count tat cur before":
--          count, the permits its entries hold; tat, the pace's next
--          place (µs); cur and before, where the last search stopped (an
--          entry's index, the permits in the entries before it: the next
--          search starts there). Elements 1..: entries "end count", a
--          count of permits whose ends are at most end (µs), in order of
--          end. It expires when its last entry's permits stop counting.
-- KEYS[2]  pause key (pause.lua): no place while it lives
-- KEYS[3]  live limit (TokenBucket.SetLimit): replaces ARGV[2] when set
-- ARGV[1]  n ≥ 1 permits at one place, all or nothing; -k: up to k, one
--          place each (coalesced callers)
-- ARGV[2]  limit (integer ≥ 1)
-- ARGV[3]  interval, µs
-- ARGV[4]  margin, µs
-- ARGV[5]  the longest wait for a place, µs; -1 for none
-- ARGV[6]  the latest end this caller's instance was given for the key,
--          µs; 0 for none. When the schedule lacks it (Redis restarted
--          empty, a failover, the key deleted), the permits that end may
--          belong to are unknown: the script counts LIMIT of them there.
--
-- Returns {status, limit, remaining, reset, now, later, d1, d2, ...} (µs):
--   status 1: granted; d_i is permit i's place less now (one place for n).
--   status 0: refused, no place within the wait (or a pause).
-- later: for a refusal, or the permits of an up-to take left without a
-- place, the earliest place one more could have, less now; else -1.
--   status 4: n is above the limit and can never be granted.
-- remaining: LIMIT less the permits counting at now, at least 0 (-1 in a
-- pause); reset: until the last of them stops counting.
local INTERVAL, MARGIN = tonumber(ARGV[3]), tonumber(ARGV[4])
local maxWait, known = tonumber(ARGV[5]), tonumber(ARGV[6])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
local limit = tonumber(redis.call('GET', KEYS[3]) or '') or tonumber(ARGV[2])
local n = tonumber(ARGV[1])
local upTo = n < 0
if upTo then n = -n end
if not upTo and n > limit then return {4, limit, 0, 0, now, -1} end
local pause = redis.call('PTTL', KEYS[2])
if pause > 0 then return {0, limit, -1, pause * 1000, now, pause * 1000} end

-- The schedule as stored (len entries, read in chunks as needed) and the
-- entries this call adds after it (added).
local count, tat, cur, before = 0, 0, 1, 0
local h = redis.call('LINDEX', KEYS[1], 0)
if h then
  local a, b, c, d = string.match(h, '(%S+) (%S+) (%S+) (%S+)')
  count, tat, cur, before = tonumber(a), tonumber(b), tonumber(c), tonumber(d)
end
local len = math.max(redis.call('LLEN', KEYS[1]) - 1, 0)
local stored, added = {}, {}
local function entry(i) -- {end, count} of entry i, nil past the last
  if i > len then return added[i - len] end
  if stored[i] == nil then
    local r = redis.call('LRANGE', KEYS[1], i, i + 3)
    for j, v in ipairs(r) do
      local e, c = string.match(v, '(%S+) (%S+)')
      stored[i + j - 1] = {tonumber(e), tonumber(c)}
    end
  end
  return stored[i]
end
-- Entries whose permits stopped counting go (up to 64 a call; each call
-- adds at most one for every permit it places).
local gone, dropped = 0, 0
while gone < 64 do
  local e = entry(gone + 1)
  if e == nil or e[1] + INTERVAL > now then break end
  gone, dropped = gone + 1, dropped + e[2]
end
count = count - dropped
if cur <= gone then cur, before = gone + 1, 0 else before = before - dropped end
local last = entry(len) -- the tail: the latest end (nil when empty)
if last and len <= gone then last = nil end
local function append(e, c) -- a permit's end, merged into the tail's slot
  local grid = math.max(math.floor(INTERVAL / 256), 1)
  count = count + c
  if last and e <= last[1] then e = last[1] end
  if last and math.floor(e / grid) == math.floor(last[1] / grid) then
    last[1], last[2] = e, last[2] + c
    last.dirty = true
  else
    last = {e, c}
    added[#added + 1] = last
  end
end
if known > 0 and known + INTERVAL > now and (last == nil or known > last[1]) then
  append(known, limit) -- a schedule lost: count it full at its end
end
-- earliest is the first time at which need more permits fit: when enough
-- of the counted permits have stopped counting; nil if they never do.
local function earliest(need)
  local excess = count + need - limit
  if excess <= 0 then return now end
  if before >= excess then cur, before = gone + 1, 0 end
  local restarted = false
  while true do
    local e = entry(cur)
    if e == nil then
      if restarted then return nil end
      cur, before, restarted = gone + 1, 0, true -- a stale cursor: from the head
    elseif before + e[2] >= excess then
      return math.max(now, e[1] + INTERVAL)
    else
      before, cur = before + e[2], cur + 1
    end
  end
end
-- place is where a take of c permits goes: paced when the wait allows,
-- else the earliest place within the wait; nil and the earliest when none.
local pace = INTERVAL / limit
local function place(c)
  local w = earliest(c)
  if w == nil then return nil, nil end
  local p = math.ceil(math.max(w, tat))
  if maxWait < 0 or p - now <= maxWait then
    tat = p + c * pace
  elseif w - now <= maxWait then
    p = w
    tat = math.max(tat, p + c * pace)
  else
    return nil, w
  end
  append(p + MARGIN, c)
  return p, w
end
local out, later = {}, -1
if upTo then
  for _ = 1, n do
    local p, w = place(1)
    if p == nil then
      later = (w or now + INTERVAL) - now
      break
    end
    out[#out + 1] = p - now
  end
else
  local p, w = place(n)
  if p then out[1] = p - now else later = (w or now + INTERVAL) - now end
end
local status = 0
if #out > 0 then status = 1 end
-- Write back what changed: the popped entries, the tail, the new ones, the
-- header, the expiry.
if status == 1 or gone > 0 or #added > 0 then
  local hdr = string.format('%d %d %d %d', count, math.ceil(tat), cur - gone, before)
  if last and last.dirty and len > gone and last == entry(len) then
    redis.call('LSET', KEYS[1], -1, string.format('%d %d', last[1], last[2]))
  end
  for _, e in ipairs(added) do
    redis.call('RPUSH', KEYS[1], string.format('%d %d', e[1], e[2]))
  end
  if not h then
    redis.call('LPUSH', KEYS[1], hdr)
  elseif gone > 0 then
    redis.call('LTRIM', KEYS[1], gone + 1, -1)
    redis.call('LPUSH', KEYS[1], hdr)
  else
    redis.call('LSET', KEYS[1], 0, hdr)
  end
  if last then
    redis.call('PEXPIRE', KEYS[1], math.floor((last[1] + INTERVAL - now) / 1000) + 1)
  else
    redis.call('DEL', KEYS[1]) -- nothing counts any more
  end
end
local reset = 0
if last then reset = last[1] + INTERVAL - now end
local res = {status, limit, math.max(limit - count, 0), reset, now, later}
for _, d in ipairs(out) do res[#res + 1] = d end
return res
