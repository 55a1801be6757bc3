#!lua flags=allow-oom
-- heartbeat.lua: say a listener is alive (or gone), and forget listeners that went quiet.
--
-- KEYS[1]  listeners: zset, listener id -> heartbeat deadline ms
-- KEYS[2]  listener info: hash, listener id -> JSON
-- ARGV[1]  listener id
-- ARGV[2]  ms until this heartbeat lapses
-- ARGV[3]  JSON about the listener, or "" when it is shutting down
--
-- A listener that died drops off once its deadline passes. (Its timers need nothing from
-- here: their leases lapse on their own and the sweepers run them again.)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 10)
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
return #gone
