#!lua
-- near.lua: write the expiring keys of timers that have come within the near horizon.
--
-- KEYS[1]  due index: zset, escaped id -> due ms (the plain one; the others are listed
--          in "<prefix>|queues")
-- KEYS[2]  records: hash, escaped id -> record
-- KEYS[3]  near: hash, "until", and where an unfinished pass stopped ("sweep", "index",
--          "cursor"); declared, so that while a cluster migrates the slot the call goes
--          where the hash is, instead of writing a second copy (BUSYKEY)
-- KEYS[4..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  limit: the most timers to look at in this call, over all due indexes
--
-- Timers due further out than the horizon are pended without a key (prelude.lua pend).
-- "<prefix>|near" field "until" says up to which due time every pending timer has its
-- key. A sweep moves it on to "sweep" (now + horizon when the sweep began), keying the
-- timers due in between one due index after another (sorted names: the plain one first),
-- "limit" timers a call at most, so no call holds Redis for long whatever the backlog.
-- "index" and "cursor" ("<due> <id>", the last timer keyed) say where the sweep is: a
-- call goes on from the cursor's rank, so even a million timers sharing one due time
-- are keyed a batch at a time; if the cursor's timer has gone (fired, cancelled), it
-- goes on from the first timer of the cursor's due time (keys written again change
-- nothing). Timers pended during a sweep need nothing from it: pend() keys those within
-- the horizon, and those beyond it are due after "sweep". A timer due by now gets no key
-- (the sweeper has it).
-- Returns {until after the call, 1 if it reached now + horizon else 0, keys written}.
if not is_count(ARGV[2]) or tonumber(ARGV[2]) < 1 then
  return redis.error_reply('ERR timers near: bad limit')
end
local now = redis_now()
local budget = tonumber(ARGV[2])
local near_key = KEYS[3]
local target = now + near_horizon(ARGV[1])
local state = redis.call('HMGET', near_key, 'until', 'sweep', 'index', 'cursor')
local from = tonumber(state[1] or '') or now
local sweep = tonumber(state[2] or '')

local function fmt(ms) return string.format('%.0f', ms) end

if not sweep then
  if from >= target then return {fmt(from), 1, 0} end
  sweep, state[3], state[4] = target, nil, nil
end
local sweep_text = fmt(sweep)

-- The due indexes in a fixed order: the plain one, then the queues' by name.
local indexes = {}
for _, queue in ipairs(redis.call('SMEMBERS', sys_key(ARGV[1], 'queues'))) do
  indexes[#indexes + 1] = KEYS[1] .. '|' .. queue
end
table.sort(indexes)
table.insert(indexes, 1, KEYS[1])

-- The next timers of `index` after the cursor (or after `from`), as {id, due, ...}.
local function next_batch(index, cursor, limit)
  -- a cursor that does not read as "<due ms> <id>" (garbled) restarts the index
  local due_text, id = string.match(cursor or '', '^(%d+) (.+)$')
  if due_text then
    local score = redis.call('ZSCORE', index, id)
    if score and tonumber(score) == tonumber(due_text) then
      local rank = redis.call('ZRANK', index, id) + 1
      return redis.call('ZRANGE', index, rank, rank + limit - 1, 'WITHSCORES')
    end
    return redis.call('ZRANGEBYSCORE', index, due_text, sweep_text, 'WITHSCORES',
      'LIMIT', 0, limit)
  end
  return redis.call('ZRANGEBYSCORE', index, '(' .. fmt(math.max(from, now)), sweep_text,
    'WITHSCORES', 'LIMIT', 0, limit)
end

-- Key up to `budget` timers of `index` from `cursor` (`key_one(key, due)`: set_near_key,
-- or in the declare part need); returns the new cursor, or nil when the index is keyed
-- through the sweep's end.
local function key_index(index, cursor, key_one)
  while budget > 0 do
    local limit = budget
    local due = next_batch(index, cursor, limit)
    local past_end = false
    for i = 1, #due, 2 do
      local when = tonumber(due[i + 1])
      if when > sweep then past_end = true break end
      local record = redis.call('HGET', KEYS[2], due[i])
      if record then key_one(ARGV[1] .. due[i] .. ':' .. record, when) end
      cursor = due[i + 1] .. ' ' .. due[i]
      budget = budget - 1
    end
    if past_end or #due < 2 * limit then return nil end
  end
  return cursor
end

local position, cursor = 1, state[4]
for i, index in ipairs(indexes) do
  if index == state[3] then position = i end
end
if state[3] and indexes[position] ~= state[3] then cursor = nil end  -- its queue went
-- declare {
local all_declared = true
for i = position, #indexes do all_declared = need(indexes[i]) and all_declared end
if all_declared then  -- the same walk, each key it would write asked for: twice as far
  local declare_budget, declare_cursor = budget, cursor  -- (now moves on: DECLARE_SLACK_MS)
  budget = 2 * budget
  for i = position, #indexes do
    declare_cursor = key_index(indexes[i], declare_cursor, need)
    if declare_cursor then break end
  end
  budget = declare_budget
end
local asked = keys_asked()
if asked then return asked end
-- declare }
local keyed = 0
local function set_key(key, due)
  if set_near_key(ARGV[1], key, due, now) then keyed = keyed + 1 end
end
for i = position, #indexes do
  cursor = key_index(indexes[i], cursor, set_key)
  if cursor then
    redis.call('HSET', near_key, 'index', indexes[i], 'cursor', cursor, 'sweep', sweep_text)
    return {fmt(from), 0, keyed}
  end
end
redis.call('HDEL', near_key, 'index', 'cursor', 'sweep')
redis.call('HSET', near_key, 'until', sweep_text)
return {sweep_text, sweep >= target and 1 or 0, keyed}
