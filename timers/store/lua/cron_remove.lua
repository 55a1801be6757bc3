#!lua flags=allow-oom
-- cron_remove.lua: delete a recurrence and withdraw its pending occurrence.
--
-- KEYS[1]  recurrence definitions: hash, escaped name -> definition JSON
-- KEYS[2]  recurrence states: hash, escaped name -> "v|last|prev|paused|run|anchor"
-- KEYS[3]  due index: zset, escaped id -> due ms
-- KEYS[4]  records: hash, escaped id -> record
-- KEYS[5..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  escaped name
-- ARGV[3]  wake channel
--
-- The pending occurrence "<name>@<last>" is named by the state and its key by the stored
-- record, so both are built here (as in cancel.lua). An occurrence already claimed finds
-- no recurrence when it comes to run and is skipped.
-- allow-oom: it only frees memory.
-- Returns 1 when the recurrence existed, 0 otherwise.
local raw = redis.call('HGET', KEYS[2], ARGV[2])
-- declare {
local declared_state = state_read(raw)
if declared_state then
  need_withdraw(ARGV[1], KEYS[4], occurrence(ARGV[2], declared_state.last))
end
local asked = keys_asked()
if asked then return asked end
-- declare }
local existed = redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[2], ARGV[2])
local state = state_read(raw)
if state and withdraw(KEYS[3], KEYS[4], ARGV[1], occurrence(ARGV[2], state.last)) then
  unpark(ARGV[1], occurrence(ARGV[2], state.last))
  wake(ARGV[3])
end
if existed == 1 or raw then return 1 end
return 0
