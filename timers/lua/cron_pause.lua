#!lua flags=allow-oom
-- cron_pause.lua: pause a recurrence: withdraw its pending occurrence, schedule no more.
--
-- KEYS[1]  recurrence states: hash, escaped name -> "v|last|prev|paused|run|anchor"
-- KEYS[2]  due index: zset, escaped id -> due ms
-- KEYS[3]  records: hash, escaped id -> record
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  escaped name
--
-- The pending occurrence "<name>@<last>" is named by the state and its key by the stored
-- record, so both are built here (as in cancel.lua). Once it is withdrawn, last goes back
-- to the occurrence before it: resuming schedules the next one after that (and after
-- now). An occurrence already claimed is skipped when it comes to run.
-- allow-oom: it only frees memory (the state is rewritten in place).
-- Returns 1 when paused now, 0 when it was paused already, -1 when there is no such
-- recurrence.
local raw = redis.call('HGET', KEYS[1], ARGV[2])
if not raw then return -1 end
local v, last, prev, paused, run, anchor =
  string.match(raw, '^(%d+)|(%-?%d+)|(%-?%d+)|([01])|([^|]*)|(%-?%d+)$')
if not v then return -1 end
if paused == '1' then return 0 end
local id = ARGV[2] .. '@' .. last
local record = redis.call('HGET', KEYS[3], id)
if record then
  redis.call('ZREM', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id)
  redis.call('DEL', ARGV[1] .. id .. ':' .. record)
  last = prev
end
redis.call('HSET', KEYS[1], ARGV[2], table.concat({v, last, prev, '1', run, anchor}, '|'))
return 1
