#!lua flags=allow-oom
-- forget.lua: delete a failure record, unless it changed since it was read.
--
-- KEYS[1]  failures: zset, failure id -> time of failure ms
-- KEYS[2]  failure records: hash, failure id -> JSON
-- KEYS[3]  failure index: zset (all scores 0), failure ids of dead timers, which start
--          with "<escaped id>:" (read by timer id with ZRANGEBYLEX)
-- ARGV[1]  failure id
-- ARGV[2]  the record as it was read ("" to delete whatever is there)
--
-- allow-oom: it only frees memory. Used after a failed timer was scheduled again: if it
-- failed anew in between, the new record stays. Returns 1 when the record was deleted.
local current = redis.call('HGET', KEYS[2], ARGV[1])
if not current or (ARGV[2] ~= '' and current ~= ARGV[2]) then return 0 end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
