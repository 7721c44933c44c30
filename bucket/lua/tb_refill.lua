-- tb_refill.lua: start a token bucket's next period, fenced, and take the
-- refilling caller's tokens from it.
--
-- KEYS[1]  tokens key (see tb_take.lua)
-- KEYS[2]  pause key of the same budget (see pause.lua)
-- KEYS[3]  optional: live limit, a string set by an operator
--          (TokenBucket.SetLimit); when present it replaces ARGV[1]
-- KEYS[4]  optional: the period's limit, set here with the tokens' expiry
-- ARGV[1]  limit: tokens per period (integer ≥ 1)
-- ARGV[2]  period in milliseconds (integer ≥ 1)
-- ARGV[3]  n, tokens the refilling caller asks (1 ≤ n ≤ limit)
--
-- Returns {status, remaining, reset_ms}:
--   status 1: refilled, and the caller's n tokens taken from the new period.
--   status 2: refilled, nothing taken (a pause is running).
--   status 0: the current period has not ended (the key still has its
--             expiry): someone else refilled; the caller should take again.
--   status 3: refilled, nothing taken: n is above the limit in force.
-- Statuses 1, 2 and 3 add a fourth element: the limit in force.
--
-- Guarantee (the fence): the tokens are set only when the previous period
-- has really ended on the server's clock, so two refills can never land in
-- one period, whoever holds the refill mutex and however long its holder
-- was paused. Refills are therefore at least one period apart, and each
-- gives at most limit tokens.
if redis.call('PTTL', KEYS[1]) >= 0 then
  return {0, 0, 0}
end
local limit = tonumber(ARGV[1])
if KEYS[3] then
  limit = tonumber(redis.call('GET', KEYS[3]) or limit) or limit
end
local n = tonumber(ARGV[3])
if KEYS[4] then
  redis.call('SET', KEYS[4], limit, 'PX', ARGV[2])
end
if redis.call('PTTL', KEYS[2]) > 0 then
  redis.call('SET', KEYS[1], limit, 'PX', ARGV[2])
  return {2, limit, tonumber(ARGV[2]), limit}
end
if n > limit then
  redis.call('SET', KEYS[1], limit, 'PX', ARGV[2])
  return {3, limit, tonumber(ARGV[2]), limit}
end
redis.call('SET', KEYS[1], limit - n, 'PX', ARGV[2])
return {1, limit - n, tonumber(ARGV[2]), limit}
