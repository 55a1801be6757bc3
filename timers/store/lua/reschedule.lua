#!lua flags=allow-oom
-- reschedule.lua: move a pending timer to a new due time; its id, task and args stay.
-- State machine: docs/state-machine.md (transitions T2).
--
-- KEYS[1]  due index: zset, escaped id -> due ms
-- KEYS[2]  records: hash, escaped id -> record
-- KEYS[3..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  escaped id
-- ARGV[4]  mode: "in" (ms from now) | "at" (epoch ms, 0 or later)
-- ARGV[5]  ms (an integer)
--
-- allow-oom: it changes a timer in place (same key, same entries), so it runs on a full
-- server. Its arguments are checked before the first write; an "in" due time before 1970
-- counts as 0. The timer's key is named by its stored record, so it is built here from
-- ARGV[1]. The wake is a PUBLISH by pcall: a user who may not publish still reschedules.
-- A timer waiting for a concurrency key or a rate limit leaves its queue (flow.lua) and
-- goes through its gate again when it comes due.
-- Returns the new due ms, or nil when the id is not pending.
local now = redis_now()
local due = is_int(ARGV[5]) and tonumber(ARGV[5])
if not due or (ARGV[4] ~= 'in' and ARGV[4] ~= 'at') or ARGV[3] == ''
    or string.find(ARGV[3], ':', 1, true) then
  return redis.error_reply('ERR timers reschedule: bad arguments')
end
if ARGV[4] == 'in' then due = math.max(now + due, 0) end
if due < 0 then return redis.error_reply('ERR timers reschedule: due time before 1970') end
local record = redis.call('HGET', KEYS[2], ARGV[3])
if not record then return false end
-- declare {
need_withdraw(ARGV[1], KEYS[2], ARGV[3])
need_timer(ARGV[1], ARGV[3], without_waited_from(record))
local asked = keys_asked()
if asked then return asked end
-- declare }
unpark(ARGV[1], ARGV[3])  -- a timer held back by a flow gate goes through it again
local fresh = without_waited_from(record)
if fresh ~= record then withdraw(KEYS[1], KEYS[2], ARGV[1], ARGV[3]) end
pend(KEYS[1], KEYS[2], ARGV[1], ARGV[3], fresh, due, now)
wake(ARGV[2])
return due
