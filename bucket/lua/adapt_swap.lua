-- adapt_swap.lua: read, or compare-and-swap, a budget's adaptive state.
--
-- KEYS[1]  adaptive state of the budget: a hash with fields r (rate), c
--          (ceiling), p (peak), s (probe step), all in thousandths of a
--          permit per interval; d, i, x (times of the last decrease,
--          increase and refusal, µs since the epoch on the server's
--          clock); v (version, counts the swaps)
-- ARGV[1]  the version the caller read; below 0: only read
-- ARGV[2]  time to live in ms (≥ 1): the state is forgotten after it
--          without a swap
-- ARGV[3..9]  the new r, c, p, s, d, i, x (integers)
--
-- Returns {swapped, now_us, r, c, p, s, d, i, x, v}: the state in the
-- hash after the call (0 for absent fields) and whether it was replaced.
--
-- Guarantee: a swap applies only to the version it was computed from, so
-- two instances that read the same state cannot both change it; the
-- version only grows while the hash lives.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local names = {'r', 'c', 'p', 's', 'd', 'i', 'x', 'v'}
local f = redis.call('HMGET', KEYS[1], unpack(names))
local cur = tonumber(f[8] or '0') or 0
local want = tonumber(ARGV[1])
if want < 0 or want ~= cur then
  local out = {0, now}
  for k = 1, 8 do out[2 + k] = tonumber(f[k] or '0') or 0 end
  return out
end
local out = {1, now}
local args = {}
for k = 1, 7 do
  out[2 + k] = tonumber(ARGV[2 + k])
  args[#args + 1] = names[k]
  args[#args + 1] = ARGV[2 + k]
end
args[#args + 1] = 'v'
args[#args + 1] = cur + 1
out[10] = cur + 1
redis.call('HSET', KEYS[1], unpack(args))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
return out
