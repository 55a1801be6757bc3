#!lua flags=allow-oom
-- cron_pause.lua: pause a recurrence: withdraw its pending occurrence, schedule no more.
--
-- KEYS[1]  recurrence states: hash, escaped name -> "v|last|prev|paused|run|anchor"
-- KEYS[2]  due index: zset, escaped id -> due ms
-- KEYS[3]  records: hash, escaped id -> record
-- KEYS[4..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  escaped name
-- ARGV[3]  wake channel
--
-- The pending occurrence "<name>@<last>" is named by the state and its key by the stored
-- record, so both are built here (as in cancel.lua). Once it is withdrawn, last goes back
-- to the occurrence before it: resuming schedules the next one after that (and after
-- now). An occurrence already claimed is skipped when it comes to run.
-- allow-oom: it only frees memory (the state is rewritten in place).
-- Returns 1 when paused now, 0 when it was paused already, -1 when there is no such
-- recurrence.
local state = state_read(redis.call('HGET', KEYS[1], ARGV[2]))
if not state then return -1 end
if state.paused == '1' then return 0 end
-- declare {
need_withdraw(ARGV[1], KEYS[3], occurrence(ARGV[2], state.last))
local asked = keys_asked()
if asked then return asked end
-- declare }
if withdraw(KEYS[2], KEYS[3], ARGV[1], occurrence(ARGV[2], state.last)) then
  unpark(ARGV[1], occurrence(ARGV[2], state.last))
  wake(ARGV[3])
  state.last = state.prev
end
state.paused = '1'
state_write(KEYS[1], ARGV[2], state)
return 1
