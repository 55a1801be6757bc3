#!lua flags=allow-oom
-- heartbeat.lua: say a listener is alive (or gone), and forget listeners that went quiet.
--
-- KEYS[1]  listeners: zset, listener id -> heartbeat deadline ms
-- KEYS[2]  listener info: hash, listener id -> JSON
-- KEYS[3]  task sets: hash, task set digest -> the task paths, one a line
-- ARGV[1]  listener id
-- ARGV[2]  ms until this heartbeat lapses (an integer)
-- ARGV[3]  JSON about the listener, or "" when it is shutting down; its "task_set" names
--          the digest of the tasks it can run (timers/ops/fleet.py)
-- ARGV[4]  that digest, or "" (none announced)
-- ARGV[5]  the task paths of that digest, one a line: written under it (a listener sends
--          them on its first heartbeat, and again if it finds them gone), or "" (sent)
--
-- Returns {stored, id, id, ...}: 1 if the task list of the digest in ARGV[4] is stored
-- (or none is named), else 0 (a flush or a failover lost it: the listener sends it with
-- its next heartbeat); then the ids of the live listeners (lanes of a sharded prefix
-- share each shard's sweeping out by them: see timers/listener/lanes.py).
--
-- When a listener goes (or lapses), the task sets no live listener's JSON names any more
-- are dropped: the hash holds one entry per distinct release running, no history.
--
-- allow-oom: one small entry per live listener, replaced in place, and one task list per
-- release running, so a listener on a full server still shows as alive (and what it runs). A listener that died drops off once its deadline
-- passes. (Its timers need nothing from here: their leases lapse on their own and the
-- sweepers run them again.)
local ttl = is_count(ARGV[2]) and tonumber(ARGV[2])
if not ttl or not ARGV[1] or ARGV[1] == '' or not ARGV[3] or not ARGV[4] or not ARGV[5]
    or (ARGV[5] ~= '' and ARGV[4] == '') then
  return redis.error_reply('ERR timers heartbeat: bad arguments')
end
local now = redis_now()
local dropped = false
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  dropped = redis.call('HDEL', KEYS[2], ARGV[1]) == 1
else
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + ttl), ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  if ARGV[5] ~= '' then redis.call('HSET', KEYS[3], ARGV[4], ARGV[5]) end
end
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, 10)
for _, id in ipairs(gone) do
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  dropped = true
end
if dropped and redis.call('EXISTS', KEYS[3]) == 1 then
  local named = {}
  for _, info in ipairs(redis.call('HVALS', KEYS[2])) do
    local ok, beat = pcall(cjson.decode, info)
    if ok and type(beat) == 'table' and type(beat.task_set) == 'string' then
      named[beat.task_set] = true
    end
  end
  for _, digest in ipairs(redis.call('HKEYS', KEYS[3])) do
    if not named[digest] then redis.call('HDEL', KEYS[3], digest) end
  end
end
local reply = {(ARGV[4] == '' or redis.call('HEXISTS', KEYS[3], ARGV[4]) == 1) and 1 or 0}
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do reply[#reply + 1] = id end
return reply
