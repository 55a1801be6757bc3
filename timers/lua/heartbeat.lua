#!lua flags=allow-oom
-- heartbeat.lua: say a listener is alive (or gone), and forget listeners that went quiet.
--
-- KEYS[1]  listeners: zset, listener id -> heartbeat deadline ms
-- KEYS[2]  listener info: hash, listener id -> JSON
-- ARGV[1]  listener id
-- ARGV[2]  ms until this heartbeat lapses (an integer)
-- ARGV[3]  JSON about the listener, or "" when it is shutting down
--
-- Returns the ids of the live listeners (lanes of a sharded prefix share each shard's
-- sweeping out by them: see timers/listener/lanes.py).
--
-- allow-oom: one small entry per live listener, replaced in place, so a listener on a
-- full server still shows as alive. A listener that died drops off once its deadline
-- passes. (Its timers need nothing from here: their leases lapse on their own and the
-- sweepers run them again.)
local ttl = is_count(ARGV[2]) and tonumber(ARGV[2])
if not ttl or not ARGV[1] or ARGV[1] == '' or not ARGV[3] then
  return redis.error_reply('ERR timers heartbeat: bad arguments')
end
local now = redis_now()
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
else
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 10)
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
end
return redis.call('ZRANGE', KEYS[1], 0, -1)
