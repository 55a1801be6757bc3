#!lua
-- move.lua: move timers of chosen tasks from one prefix to another on the same server,
-- each gone from the old prefix only as it is written to the new one (timers move).
--
-- KEYS[1]  old due index: zset (the plain one; a record's group and priority name its
--          own, see prelude.lua)
-- KEYS[2]  old records: hash
-- KEYS[3]  old failures: zset
-- KEYS[4]  old failure records: hash
-- KEYS[5]  old failure index: zset
-- KEYS[6]  new due index: zset
-- KEYS[7]  new records: hash
-- KEYS[8]  new failures: zset
-- KEYS[9]  new failure records: hash
-- KEYS[10] new failure index: zset
-- KEYS[11..]  shared keys: Keyspace.script_keys of the old prefix (timers/model/keys.py)
-- KEYS[..]   new shared keys: those of the new prefix (the helpers find them by name)
-- ARGV[1]  old timer key start "<old prefix>:"
-- ARGV[2]  new timer key start "<new prefix>:"
-- ARGV[3]  new wake channel
-- ARGV[4]  the tasks to move, joined by "," ("": every task)
-- ARGV[5]  "p": pending timers, "d": dead timers
-- ARGV[6..] escaped ids of pending timers, or failure ids of dead ones ("<id>:<token>")
--
-- A pending timer moves with its record and due time: out of its due index, records and
-- expiring key under the old prefix, pended under the new one (its key set if due within
-- the near horizon). A dead timer's failure record moves with its time and index entry.
-- Each one is left where it is when it is gone (claimed, cancelled, retried meanwhile),
-- of another task, not in a due index (a flow gate holds it: a key's or a rate's queue)
-- or when the new prefix has one under that id already.
-- All its keys share the hash tag on a cluster only when both prefixes do: the caller
-- checks. Arguments are checked before the first write.
-- Returns {moved, left: gone, left: other task, left: held by a gate, left: taken id}.
if (ARGV[5] ~= 'p' and ARGV[5] ~= 'd') or not ARGV[1] or ARGV[1] == '' or not ARGV[2]
    or ARGV[2] == '' or ARGV[1] == ARGV[2] then
  return redis.error_reply('ERR timers move: bad arguments')
end
for i = 6, #ARGV do
  if ARGV[i] == '' then return redis.error_reply('ERR timers move: empty id') end
end
local tasks = nil
for task in string.gmatch(ARGV[4], '[^,]+') do
  tasks = tasks or {}
  tasks[task] = true
end
-- declare {
if ARGV[5] == 'p' then  -- each pending timer's due indexes and keys, here and there
  for i = 6, #ARGV do
    local record = redis.call('HGET', KEYS[2], ARGV[i])
    if record then
      need_timer(ARGV[1], ARGV[i], record)
      need_timer(ARGV[2], ARGV[i], record)
    end
  end
end
local asked = keys_asked()
if asked then return asked end
-- declare }
local now = redis_now()
local moved, gone, other, held, taken = 0, 0, 0, 0, 0

local function wanted(task)
  return task and (tasks == nil or tasks[task])
end

local function move_pending(id)
  local record = redis.call('HGET', KEYS[2], id)
  if not record then gone = gone + 1 return end
  if not wanted(record_task(record)) then other = other + 1 return end
  local due = redis.call('ZSCORE', (due_key_for(KEYS[1], record)), id)
  if not due then held = held + 1 return end
  if redis.call('HEXISTS', KEYS[7], id) == 1 then taken = taken + 1 return end
  pend(KEYS[6], KEYS[7], ARGV[2], id, record, tonumber(due), now)
  withdraw(KEYS[1], KEYS[2], ARGV[1], id)
  moved = moved + 1
end

local function move_dead(failure_id)
  local json = redis.call('HGET', KEYS[4], failure_id)
  if not json then gone = gone + 1 return end
  local ok, failure = pcall(cjson.decode, json)
  local task = ok and type(failure) == 'table' and type(failure.task) == 'string'
    and failure.task or nil
  if not wanted(task) then other = other + 1 return end
  if redis.call('HEXISTS', KEYS[9], failure_id) == 1 then taken = taken + 1 return end
  local at = redis.call('ZSCORE', KEYS[3], failure_id) or string.format('%.0f', now)
  redis.call('HSET', KEYS[9], failure_id, json)
  redis.call('ZADD', KEYS[8], at, failure_id)
  if redis.call('ZREM', KEYS[5], failure_id) == 1 then
    redis.call('ZADD', KEYS[10], 0, failure_id)
  end
  redis.call('HDEL', KEYS[4], failure_id)
  redis.call('ZREM', KEYS[3], failure_id)
  moved = moved + 1
end

for i = 6, #ARGV do
  if ARGV[5] == 'p' then move_pending(ARGV[i]) else move_dead(ARGV[i]) end
end
wake(ARGV[3])
return {moved, gone, other, held, taken}
