#!lua flags=allow-oom
-- cancel.lua: remove a pending timer so that it never fires.
-- State machine: docs/state-machine.md (transitions T3).
--
-- KEYS[1]  due index: zset, escaped id -> due ms
-- KEYS[2]  records: hash, escaped id -> record
-- KEYS[3]  history: zset, batch id -> end ms (history.lua)
-- KEYS[4]  history records: hash, escaped id -> "<batch id>|<record>"
-- KEYS[5]  history retention: string "<age ms> <count>" the listeners keep to
-- KEYS[6]  history expiry: zset, batch id -> when its records expire, ms
-- KEYS[7]  history task ages: hash, task -> its own age ms (0: keeps none), which
--          replaces the listeners' age for that task's timers
-- KEYS[8]  history batches: hash, batch id -> the escaped ids it wrote (history.lua)
-- KEYS[9]  sequence: counter that numbers run tokens and history batches
-- KEYS[10] history task counts: hash, task -> its own count (0: keeps none): its task
--          zset (history.lua, the task's index) is trimmed to that count
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  escaped id
-- ARGV[3]  who cancels ("host:pid", no '|'), for its history record
-- ARGV[4]  the retention "<age ms> <count>" to keep to when KEYS[5] holds none
-- ARGV[5]  wake channel
-- KEYS[11..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
--
-- allow-oom: it frees the timer's record and keys, and adds a smaller history record (a
-- batch of one, in its task's zset; none when the retention or its task's own age or count
-- keeps none), trimming its task's zset to its count (the listeners' trim.lua calls keep
-- the history to its retention).
-- The timer's key is named by its stored record, so it is built here from ARGV[1]. A timer
-- waiting for a concurrency key or a rate limit leaves its queue (flow.lua).
-- Returns 1 when the timer was pending (it will not fire), 0 otherwise.
local retention = redis.call('GET', KEYS[5]) or ARGV[4]
local age, count = string.match(retention, '^(%d+) (%d+)$')
if not age then age, count = string.match(ARGV[4], '^(%d+) (%d+)$') end
if not age or string.find(ARGV[3], '|', 1, true) then
  return redis.error_reply('ERR timers cancel: bad arguments')
end
-- declare {
local withdrawn = need_withdraw(ARGV[1], KEYS[2], ARGV[2])
local withdrawn_task = withdrawn and string.match(withdrawn, '^([^;:]+)')
if withdrawn_task then need(history_task_key(KEYS[3], withdrawn_task)) end
local asked = keys_asked()
if asked then return asked end
-- declare }
local record = withdraw(KEYS[1], KEYS[2], ARGV[1], ARGV[2])
if record then
  unpark(ARGV[1], ARGV[2])
  age, count = tonumber(age), tonumber(count)
  local task = string.match(record, '^([^;:]+)')
  local own_count = nil  -- its task's own count, if it has one
  if task and age > 0 and count > 0 then
    age = tonumber(redis.call('HGET', KEYS[7], task)) or age
    own_count = tonumber(redis.call('HGET', KEYS[10], task))
  end
  if task and age > 0 and count > 0 and own_count ~= 0 then
    local now = redis_now()
    local ended = string.format('%.0f', now)
    local attempts = string.match(record, '^[^:]*;a=(%d+)') or '0'
    history_add(KEYS[3], KEYS[6], KEYS[4], KEYS[8], KEYS[9], ARGV[2], table.concat(
      {'ca', ended, '', attempts, '', ARGV[3], task, ''}, '|'), now, age)
    local key = history_task_key(KEYS[3], task)
    redis.call('ZADD', key, ended, ARGV[2])
    if own_count then history_task_trim(key, KEYS[4], task, own_count, 8) end
  end
  wake(ARGV[5])
  return 1
end
return 0
