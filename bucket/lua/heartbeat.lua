-- heartbeat.lua: record that an instance is alive and count the live ones.
--
-- KEYS[1]  the bucket's instance set: a sorted set, member = instance id,
--          score = the instance's last beat (ms since the Unix epoch, the
--          server's TIME)
-- ARGV[1]  this instance's id
-- ARGV[2]  window in ms: an instance counts as live if it beat within it
--
-- Returns the number of live instances, this one included (≥ 1). Members
-- older than the window are removed; the set expires after two windows of
-- silence.
--
-- Guarantee: the count is of distinct ids that beat within the window on
-- the server's clock, so instances with skewed clocks count alike.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. (now - window))
redis.call('PEXPIRE', KEYS[1], 2 * window)
return redis.call('ZCARD', KEYS[1])
