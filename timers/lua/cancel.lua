#!lua flags=allow-oom
-- cancel.lua: remove a pending timer so that it never fires.
-- State machine: docs/state-machine.md (transitions T3).
--
-- KEYS[1]  due index: zset, escaped id -> due ms
-- KEYS[2]  records: hash, escaped id -> record
-- KEYS[3..]  shared keys: timers/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  escaped id
-- ARGV[3]  wake channel
--
-- allow-oom: it only frees memory, so it runs on a full server. The timer's key is named
-- by its stored record, so it is built here from ARGV[1]. A timer waiting for a
-- concurrency key or a rate limit leaves its queue (flow.lua).
-- Returns 1 when the timer was pending (it will not fire), 0 otherwise.
if withdraw(KEYS[1], KEYS[2], ARGV[1], ARGV[2]) then
  unpark(ARGV[1], ARGV[2])
  wake(ARGV[3])
  return 1
end
return 0
