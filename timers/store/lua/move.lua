#!lua
-- move.lua: move timers of chosen tasks from one prefix to another on the same server, a
-- page of one index per call, each gone from the old prefix only as it is written to the
-- new one (timers move; timers/ops/moves.py walks every index with it).
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
-- KEYS[11] walked index: the one this call walks, an old due index ("p") or the old
--          failure index ("d")
-- KEYS[12..]  shared keys: Keyspace.script_keys of the old prefix (timers/model/keys.py)
-- KEYS[..]   new shared keys: those of the new prefix (the helpers find them by name)
-- ARGV[1]  old timer key start "<old prefix>:"
-- ARGV[2]  new timer key start "<new prefix>:"
-- ARGV[3]  new wake channel
-- ARGV[4]  the tasks to move, joined by "," ("": every task)
-- ARGV[5]  "p": pending timers, "d": dead timers
-- ARGV[6]  page: how many entries of the index this call reads (1 or more)
-- ARGV[7]  the cursor: the score of the last entry an earlier call read ("": from the start)
-- ARGV[8]  ... and its member
--
-- The cursor is an entry, not a rank: this call reads the entries after (score, member)
-- in the index's order (score, then member bytewise), found here in the same atomic step,
-- so whatever claims, cancels or this walk removed meanwhile, nothing not yet read is
-- skipped (design invariant 14). A pending timer moves with its record and due time: out
-- of its due index, records and expiring key under the old prefix, pended under the new
-- one (its key set if due within the near horizon). A dead timer's failure record moves
-- with its time and index entry. One is left where it is when it is of another task,
-- when a flow limit holds it (a promoted timer: its kept slot or rate slot is the old
-- prefix's) or when the new prefix has one under that id already.
-- All its keys share the hash tag on a cluster only when both prefixes do: the caller
-- checks. Arguments are checked before the first write.
-- Returns {moved, other task, left: held by a limit, left: taken id, entries read, the
-- last entry's score, its member} ("", "" when it read none).
if (ARGV[5] ~= 'p' and ARGV[5] ~= 'd') or not ARGV[1] or ARGV[1] == '' or not ARGV[2]
    or ARGV[2] == '' or ARGV[1] == ARGV[2] or not is_count(ARGV[6]) or ARGV[6] == '0'
    or not ARGV[8] or (ARGV[7] ~= '' and not tonumber(ARGV[7])) then
  return redis.error_reply('ERR timers move: bad arguments')
end
local tasks = nil
for task in string.gmatch(ARGV[4], '[^,]+') do
  tasks = tasks or {}
  tasks[task] = true
end

-- Whether member `a` sorts after `b` in a sorted set (bytewise: Lua's own comparison
-- follows the server's locale).
local function bytes_after(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end

-- The rank of the first entry after the cursor: those of a lower score, then those of
-- its score up to its member (found by halving: members of one score are in byte order).
local function first_after(index, score, member)
  if score == '' then return 0 end
  local low = redis.call('ZCOUNT', index, '-inf', '(' .. score)
  local high = redis.call('ZCOUNT', index, '-inf', score)
  while low < high do
    local middle = math.floor((low + high) / 2)
    if bytes_after(redis.call('ZRANGE', index, middle, middle)[1], member) then
      high = middle
    else
      low = middle + 1
    end
  end
  return low
end

local size = tonumber(ARGV[6])
local start = first_after(KEYS[11], ARGV[7], ARGV[8])
local page = redis.call('ZRANGE', KEYS[11], start, start + size - 1, 'WITHSCORES')
-- declare {
if ARGV[5] == 'p' then  -- each pending timer's due indexes and keys, here and there
  for i = 1, #page, 2 do
    local record = redis.call('HGET', KEYS[2], page[i])
    if record then
      need_timer(ARGV[1], page[i], record)
      need_timer(ARGV[2], page[i], record)
    end
  end
end
local asked = keys_asked()
if asked then return asked end
-- declare }
local now = redis_now()
local moved, other, held, taken = 0, 0, 0, 0

local function wanted(task)
  return task and (tasks == nil or tasks[task])
end

local function move_pending(id, due)
  local record = redis.call('HGET', KEYS[2], id)
  if not (record and wanted(record_task(record))) then other = other + 1 return end
  if redis.call('HEXISTS', sys_key(ARGV[1], 'parked'), id) == 1 then
    held = held + 1
    return
  end
  if redis.call('HEXISTS', KEYS[7], id) == 1 then taken = taken + 1 return end
  pend(KEYS[6], KEYS[7], ARGV[2], id, record, tonumber(due), now)
  withdraw(KEYS[1], KEYS[2], ARGV[1], id)
  moved = moved + 1
end

local function move_dead(failure_id)
  local json = redis.call('HGET', KEYS[4], failure_id)
  local ok, failure = pcall(cjson.decode, json or '')
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

for i = 1, #page, 2 do
  if ARGV[5] == 'p' then move_pending(page[i], page[i + 1]) else move_dead(page[i]) end
end
wake(ARGV[3])
return {moved, other, held, taken, #page / 2, page[#page] or '', page[#page - 1] or ''}
