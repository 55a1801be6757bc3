#!lua
-- near.lua: write the expiring keys of timers that have come within the near horizon.
--
-- KEYS[1]  due index: zset, escaped id -> due ms (the plain one; the others are listed
--          in "<prefix>|queues")
-- KEYS[2]  records: hash, escaped id -> record
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  limit: the most timers to look at per due index in this call
--
-- Timers due further out than the horizon are pended without a key (prelude.lua pend).
-- "<prefix>|near" field "until" says up to which due time every pending timer has its
-- key: this script moves it on to now + horizon, keying the timers due in between in
-- every due index, and says whether it got there (a big backlog takes several calls).
-- Timers pended meanwhile need nothing from it: pend() keys those within the horizon,
-- and those beyond are beyond "until" too. A timer due by now gets no key (the sweeper
-- has it). Writing a key that exists already changes nothing, so calls may overlap.
-- Returns {until after the call, 1 if it reached now + horizon else 0}.
if not is_count(ARGV[2]) or tonumber(ARGV[2]) < 1 then
  return redis.error_reply('ERR timers near: bad limit')
end
local now = redis_now()
local limit = tonumber(ARGV[2])
local near_key = sys_key(ARGV[1], 'near')
local target = now + near_horizon(ARGV[1])
local from = tonumber(redis.call('HGET', near_key, 'until') or '') or now
if from >= target then return {string.format('%.0f', from), 1} end
local from_text = '(' .. string.format('%.0f', math.max(from, now))

-- Key the timers of one due index due in (from, target]; how far it got.
local function key_index(index)
  local due = redis.call('ZRANGEBYSCORE', index, from_text, string.format('%.0f', target),
    'WITHSCORES', 'LIMIT', 0, limit)
  for i = 1, #due, 2 do
    local record = redis.call('HGET', KEYS[2], due[i])
    if record then
      set_near_key(ARGV[1], ARGV[1] .. due[i] .. ':' .. record, tonumber(due[i + 1]), now)
    end
  end
  if #due < 2 * limit then return target end
  local last = tonumber(due[#due])
  -- cut before the last due time read, so timers sharing it are all keyed next call
  -- (unless every timer read shares it: then the rest of that due time now)
  if last > tonumber(due[2]) then return last - 1 end
  local rest = redis.call('ZRANGEBYSCORE', index, due[#due], due[#due])
  for _, id in ipairs(rest) do
    local record = redis.call('HGET', KEYS[2], id)
    if record then set_near_key(ARGV[1], ARGV[1] .. id .. ':' .. record, last, now) end
  end
  return last
end

local reached = key_index(KEYS[1])
for _, queue in ipairs(redis.call('SMEMBERS', sys_key(ARGV[1], 'queues'))) do
  reached = math.min(reached, key_index(KEYS[1] .. '|' .. queue))
end
redis.call('HSET', near_key, 'until', string.format('%.0f', reached))
return {string.format('%.0f', reached), reached >= target and 1 or 0}
