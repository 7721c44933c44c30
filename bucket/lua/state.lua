-- state.lua: read the keys of one budget at one instant, for State.
--
-- KEYS[1], KEYS[2], ...  any keys of one budget (they share one hash
--          tag, so one cluster slot)
--
-- Returns {seconds, microseconds, pttl_1, value_1, pttl_2, value_2, ...}:
-- the server's TIME, then for each key its PTTL (-2 absent, -1 without
-- expiry) and its value: the string for a string key, the flat
-- field/value list for a hash, the elements of a list, '' for anything
-- else.
--
-- Guarantee: read only; it never changes a key, so running it at any
-- time is harmless.
local t = redis.call('TIME')
local out = {tonumber(t[1]), tonumber(t[2])}
for i = 1, #KEYS do
  local ty = redis.call('TYPE', KEYS[i])['ok']
  local v = ''
  if ty == 'string' then
    v = redis.call('GET', KEYS[i])
  elseif ty == 'hash' then
    v = redis.call('HGETALL', KEYS[i])
  elseif ty == 'list' then
    v = redis.call('LRANGE', KEYS[i], 0, -1)
  end
  out[#out + 1] = redis.call('PTTL', KEYS[i])
  out[#out + 1] = v
end
return out
