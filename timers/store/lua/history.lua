-- history.lua: the run history and the per-task series, shared by finish.lua and
-- cancel.lua (put after flow.lua). timers/model/keys.py names the keys; timers/model/wire.py is the
-- codec of both values (HistoryRecord, MinuteSlot): the scripts only check their shape.
--
--   P|hist      zset  escaped id -> when its newest end was written (ms): the history, oldest
--                     first; read newest first, trimmed from its head by count
--   P|histexp   zset  escaped id -> when its record expires (ms): its end plus the age its
--                     task keeps (its own, else the listener's); trimmed from its head by
--                     age, so tasks of different ages share one O(log n) trim
--   P|histrec   hash  escaped id -> "ki|ended ms|duration|attempts|lateness|listener|
--                     task|error" (ki: co completed, sk skipped, de dead, ca cancelled)
--   P|histcfg   string "<age ms> <count>": the retention the listeners were started with
--                     (cancel.lua keeps to it; a listener trims with its own count)
--   P|histtask  hash  task -> its own age ms (0: keeps none), for cancel.lua
--   P|series    hash  "<task>|<minute mod 1440>" -> "<minute> <runs> <failures>
--                     l<bucket>=<n>,... d<bucket>=<n>,...": a ring of minute slots per
--                     task (lateness and duration histograms); a slot of an older minute
--                     is overwritten, so its size is fixed
--   P|seriest   hash  task -> the last minute written: the tasks that have a series

local SERIES_SLOTS = 1440

-- Whether a series slot text reads.
local function series_text_ok(text)
  return string.match(text, '^%d+ %d+ %d+ l[%d=,]* d[%d=,]*$') ~= nil
end

-- Keep one ended timer's record (it replaces an older end of the same id), ended at `at`
-- (Redis ms) and kept till `at + age`.
local function history_add(hist_key, exp_key, rec_key, id, text, at, age)
  redis.call('ZADD', hist_key, at, id)
  redis.call('ZADD', exp_key, at + age, id)
  redis.call('HSET', rec_key, id, text)
end

-- Run `command` on `key` with ids[first..last] as its arguments, a thousand at a time
-- (unpack's stack is bounded).
local function each_thousand(command, key, ids)
  for first = 1, #ids, 1000 do
    redis.call(command, key, unpack(ids, first, math.min(first + 999, #ids)))
  end
end

-- Drop at most `budget` records whose expiry has come, then at most `budget` over count
-- (oldest end first, whatever their age): O(log n) each, so a call's cost is bounded
-- however long the history. Each key's dropped ids go in one command (per thousand): a
-- command per id cost some 2 us of Lua call overhead apiece.
local function history_trim(hist_key, exp_key, rec_key, now, count, budget)
  local old = redis.call('ZRANGEBYSCORE', exp_key, '-inf', now, 'LIMIT', 0, budget)
  each_thousand('ZREM', hist_key, old)
  each_thousand('ZREM', exp_key, old)
  each_thousand('HDEL', rec_key, old)
  local over = redis.call('ZCARD', hist_key) - count
  if over > 0 then
    local popped = redis.call('ZPOPMIN', hist_key, math.min(over, budget))
    local ids = {}
    for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
    each_thousand('ZREM', exp_key, ids)
    each_thousand('HDEL', rec_key, ids)
  end
end

-- "i=n,..." histogram text -> table; merged into `into` when given.
local function histogram_read(text, into)
  local out = into or {}
  for i, n in string.gmatch(text, '(%d+)=(%d+)') do
    i = tonumber(i)
    out[i] = (out[i] or 0) + tonumber(n)
  end
  return out
end

local function histogram_text(h)
  local keys = {}
  for i in pairs(h) do keys[#keys + 1] = i end
  table.sort(keys)
  local parts = {}
  for _, i in ipairs(keys) do parts[#parts + 1] = i .. '=' .. h[i] end
  return table.concat(parts, ',')
end

-- Add one minute's figures of a task to its ring slot (a slot of an older minute is
-- replaced; figures of a minute older than the slot's are dropped). O(1): one HGET, two
-- HSET.
local function series_add(series_key, tasks_key, task, text)
  local minute, runs, fails, late, took = string.match(text, '^(%d+) (%d+) (%d+) l(%S*) d(%S*)$')
  local field = task .. '|' .. (tonumber(minute) % SERIES_SLOTS)
  local old = redis.call('HGET', series_key, field)
  if old then
    local m, r, f, l, d = string.match(old, '^(%d+) (%d+) (%d+) l(%S*) d(%S*)$')
    if tonumber(m) > tonumber(minute) then return end  -- the slot holds a newer minute
    if m == minute then
      text = minute .. ' ' .. (tonumber(r) + tonumber(runs)) .. ' ' ..
        (tonumber(f) + tonumber(fails)) .. ' l' ..
        histogram_text(histogram_read(late, histogram_read(l))) .. ' d' ..
        histogram_text(histogram_read(took, histogram_read(d)))
    end
  end
  redis.call('HSET', series_key, field, text)
  redis.call('HSET', tasks_key, task, minute)
end
