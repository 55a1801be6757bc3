-- history.lua: the run history and the per-task series, shared by finish.lua, cancel.lua
-- and trim.lua (put after flow.lua). timers/model/keys.py names the keys;
-- timers/model/history.py is the codec of both values (HistoryRecord, MinuteSlot): the
-- scripts only check their shape.
--
-- The history is indexed by batch: a finish call writes one batch per distinct age among
-- the records it keeps (usually one), a cancel a batch of one. Per record, its HSET field
-- and its entry in its task's zset (and, dead, in P|histf) are written; per batch, one
-- entry in each of P|hist and P|histexp and one in P|histb. A batch id is "::<n>" (no
-- escaped id holds ':'), n a number of the keyspace's sequence (P|seq, which numbers run
-- tokens): a finish batch's is its first run's token (a run ends once), a cancel's is
-- drawn from the sequence; so no two batches share one. Records over the bounds of the
-- listeners are dropped by trim.lua (history_plan, history_upkeep), a bounded step per
-- call, their index entries with them.
--
--   P|hist      zset  batch id -> its end ms: the history, oldest first; read newest
--                     first, trimmed from its head by count
--   P|histexp   zset  batch id -> when its records expire (ms): its end plus the age its
--                     task keeps (its own, else the listener's); trimmed from its head by
--                     age, so tasks of different ages share one O(log n) trim
--   P|histb     hash  batch id -> the escaped ids it wrote, joined by ':'
--   P|histrec   hash  escaped id -> "<batch id>|ki|ended ms|duration|attempts|lateness|
--                     listener|task|error" (ki: co completed, sk skipped, de dead, ca
--                     cancelled): the newest end of each id; a newer end rewrites the field
--                     with its own batch, so a batch drops only the ids it still names
--   P|histcfg   string "<age ms> <count>": the retention the listeners were started with
--                     (cancel.lua keeps to it; a listener trims with its own count)
--   P|histtask  hash  task -> its own age ms (0: keeps none), for cancel.lua
--   P|histtaskn hash  task -> its own count (@task(history_count=N); 0: keeps none), of
--                     the tasks that have one, for cancel.lua
--   P|hist|n|<task>  zset  escaped id -> end ms: the kept records of a task, its index
--                     (`timers history --task`), named from P|hist (same hash tag); for a
--                     task with a count of its own, trimmed to the count as it is
--                     written, the oldest first, each popped id's record dropped if it is
--                     still this task's. An id that ends again under another task leaves
--                     its entry here (readers check each entry against its record)
--   P|histf     zset  escaped id -> end ms: the kept dead ends (`--failed`); an entry
--                     whose id ended since otherwise goes when its old batch is dropped
--   P|histix    string  the end ms through which every P|hist batch is indexed: batches
--                     past it with an id not starting "::" were written before the
--                     indexes, and trim.lua indexes them when nothing else is owed
--   P|series    hash  "<task>|<minute mod 1440>" -> "<minute> <runs> <failures>
--                     l<bucket>=<n>,... d<bucket>=<n>,...": a ring of minute slots per
--                     task (lateness and duration histograms); a slot of an older minute
--                     is overwritten, so its size is fixed
--   P|seriest   hash  task -> the last minute written: the tasks that have a series
--
-- Release 0.1.0 wrote batch ids ":<n>" (not in the task and dead indexes): those still
-- read and trim, and are indexed past P|histix.

local SERIES_SLOTS = 1440

-- Whether a series slot text reads.
local function series_text_ok(text)
  return string.match(text, '^%d+ %d+ %d+ l[%d=,]* d[%d=,]*$') ~= nil
end

-- The id of a new batch: named after `token`, a run token of the batch (a number of
-- `seq_key`), else (`token` nil or not a number) a number drawn from `seq_key`.
local function history_batch(seq_key, token)
  if token and string.match(token, '^%d+$') then return '::' .. token end
  return '::' .. string.format('%.0f', redis.call('INCR', seq_key))
end

-- The zset of the kept dead ends, escaped id -> end ms: "P|histf" (`hist_key` is P|hist).
local function history_failed_key(hist_key)
  return hist_key .. 'f'
end

-- Index batch `batch` (the escaped ids it wrote, joined by ':'), ended at `at` and kept till
-- `expiry` (both ms as text). Should the id be indexed already (the sequence was reset), the
-- ids are added to that batch's, which takes the newer times: no record is left unindexed.
local function history_index(hist_key, exp_key, batch_key, batch, ids_text, at, expiry)
  redis.call('ZADD', hist_key, at, batch)
  redis.call('ZADD', exp_key, expiry, batch)
  if redis.call('HSETNX', batch_key, batch, ids_text) == 0 then
    redis.call('HSET', batch_key, batch, redis.call('HGET', batch_key, batch) .. ':' .. ids_text)
  end
end

-- Keep one ended timer's record, a batch of one (it replaces an older end of the same id),
-- ended at `at` (Redis ms) and kept till `at + age`.
local function history_add(hist_key, exp_key, rec_key, batch_key, seq_key, id, text, at, age)
  local batch = history_batch(seq_key, nil)
  redis.call('HSET', rec_key, id, batch .. '|' .. text)
  history_index(hist_key, exp_key, batch_key, batch, id, string.format('%.0f', at),
    string.format('%.0f', at + age))
end

-- The zset of the kept records of `task`, escaped id -> end ms: "P|hist|n|<task>" (`hist_key`
-- is P|hist; a task name holds no '|'): the task's index, read by `timers history --task`,
-- and for a task with a count of its own, trimmed to it as it is written.
local function history_task_key(hist_key, task)
  return hist_key .. '|n|' .. task
end

-- The end ms and the task of a history record text "ki|ended|duration|attempts|lateness|
-- listener|task|error" (as finish.lua is given it), or nil when it does not read.
local function history_text_task(text)
  return string.match(text, '^%a%a|(%d+)|[^|]*|[^|]*|[^|]*|[^|]*|([^|]+)|')
end

-- A stored record's (P|histrec: "<batch id>|" and a record text) kind letters, end ms and
-- task, or nil.
local function history_value_fields(value)
  return string.match(value, '^:[^|]*|(%a%a)|(%d+)|[^|]*|[^|]*|[^|]*|[^|]*|([^|]+)|')
end

-- The task a stored record names, or nil.
local function history_record_task(value)
  return select(3, history_value_fields(value))
end

-- Of index members `members` (oldest first), the first whose ids number about `most` in
-- all (at least one member), and the ids each still names: {member, its live ids, how many
-- ids it lists, "<member>|", their stored values, its ids not live whose record (if any)
-- is not a dead end}. A batch's ids are read from P|histb, kept where their record's prefix
-- names it. A few commands in all (a thousand elements each), not a few per member: each
-- command has a fixed cost in Redis (figures: bench/FINDINGS.md, "Redis instructions in
-- the scripts").
local function history_lives(rec_key, batch_key, members, most)
  local lists, read = {}, 0  -- the lists of members[1..read], read 64 at a time
  local taken, ids, owner, listed = {}, {}, {}, 0
  for _, member in ipairs(members) do
    if listed >= most and #taken > 0 then break end
    if lists[member] == nil and read < #members then
      local last = math.min(read + 64, #members)
      local texts = redis.call('HMGET', batch_key, unpack(members, read + 1, last))
      for i = 1, last - read do lists[members[read + i]] = texts[i] or false end
      read = last
    end
    local one = {member, {}, 0, member .. '|', {}, {}}
    taken[#taken + 1] = one
    if lists[member] then
      for id in string.gmatch(lists[member], '[^:]+') do
        ids[#ids + 1], owner[#ids + 1] = id, one
      end
    end
    one[3] = #ids - listed
    listed = #ids
  end
  for first = 1, #ids, 1000 do
    local last = math.min(first + 999, #ids)
    local values = redis.call('HMGET', rec_key, unpack(ids, first, last))
    for i = 1, last - first + 1 do
      local value, one, id = values[i], owner[first + i - 1], ids[first + i - 1]
      -- a batch's record starts with "<batch>|"
      if value and string.find(value, one[4], 1, true) == 1 then
        local live = one[2]
        live[#live + 1] = id
        one[5][#live] = value
      elseif not value or history_value_fields(value) ~= 'de' then
        one[6][#one[6] + 1] = id
      end
    end
  end
  return taken
end

-- Add the index entries of the records `ids` with stored values `values`: each in its
-- task's zset, a dead end also in the failed zset (P|histf), scored by its end ms; a
-- value that does not read is left out. With `drop`, remove them instead.
local function history_reindex(hist_key, ids, values, drop)
  local by_task, order, failed = {}, {}, {}
  for i, id in ipairs(ids) do
    local kind, ended, task = history_value_fields(values[i])
    if task then
      local args = by_task[task]
      if not args then
        args = {}
        by_task[task], order[#order + 1] = args, task
      end
      if drop then args[#args + 1] = id else args[#args + 1], args[#args + 2] = ended, id end
      if kind == 'de' then
        if drop then failed[#failed + 1] = id else failed[#failed + 1], failed[#failed + 2] = ended, id end
      end
    end
  end
  local command = drop and 'ZREM' or 'ZADD'
  for _, task in ipairs(order) do
    each_thousand(command, history_task_key(hist_key, task), by_task[task])
  end
  each_thousand(command, history_failed_key(hist_key), failed)
end

-- The tasks whose zsets the live records of `taken` (history_lives) name: task -> true.
local function history_taken_tasks(taken, into)
  for _, one in ipairs(taken) do
    for _, value in ipairs(one[5]) do
      local task = history_record_task(value)
      if task then into[task] = true end
    end
  end
  return into
end

-- Drop the records of `taken` (history_lives) and their index entries (the history's, and
-- their tasks' and the failed zset's; a dead end no longer the id's newest leaves the
-- failed zset too); with `over`, only that many records (oldest first): a member whose
-- live ids are more than what is left of it keeps the rest, its P|histb list rewritten.
-- The number of records dropped.
local function history_drop(hist_key, exp_key, rec_key, batch_key, taken, over)
  local gone, values, members, stale = {}, {}, {}, {}
  for _, one in ipairs(taken) do
    local member, live = one[1], one[2]
    for _, id in ipairs(one[6]) do stale[#stale + 1] = id end
    if over and over - #gone < #live then
      local rest = {}
      for i = 1, #live do
        if i <= over - #gone then
          gone[#gone + 1], values[#gone + 1] = live[i], one[5][i]
        else
          rest[#rest + 1] = live[i]
        end
      end
      redis.call('HSET', batch_key, member, table.concat(rest, ':'))
      break
    end
    for i = 1, #live do gone[#gone + 1], values[#gone + 1] = live[i], one[5][i] end
    members[#members + 1] = member
    if over and #gone >= over then break end
  end
  each_thousand('HDEL', rec_key, gone)
  history_reindex(hist_key, gone, values, true)
  each_thousand('ZREM', history_failed_key(hist_key), stale)
  each_thousand('ZREM', hist_key, members)
  each_thousand('ZREM', exp_key, members)
  each_thousand('HDEL', batch_key, members)
  return #gone
end

-- One bounded step of the history's upkeep (trim.lua), planned here reading only (so its
-- keys can be declared) and done by history_upkeep: the first of
--   'age':   batches whose expiry has come (the head of P|histexp), about `budget` records;
--   'count': the oldest batches while the history holds more than `count` records, about
--            `budget` records (the last batch in part, so the count holds exactly);
--   'index': batches written before the index (an id not starting "::") past the cursor
--            `cursor_key` (the end ms through which every batch is indexed), about `budget`
--            records put in their tasks' and the failed zsets; the cursor moves on.
-- A plan: {step, taken (history_lives), over, cursor, more, tasks}; nil when nothing is owed.
-- Each step is O(log n) per batch plus O(1) per record, in a few commands.
local function history_plan(hist_key, exp_key, rec_key, batch_key, cursor_key, now, count,
                            budget)
  local head = math.min(budget, 256)
  local old = redis.call('ZRANGEBYSCORE', exp_key, '-inf', now, 'LIMIT', 0, head)
  if #old > 0 then
    local taken = history_lives(rec_key, batch_key, old, budget)
    return {step = 'age', taken = taken, more = true, tasks = history_taken_tasks(taken, {})}
  end
  local over = redis.call('HLEN', rec_key) - count
  if over > 0 then
    local first = redis.call('ZRANGE', hist_key, 0, math.min(over, head) - 1)
    if #first > 0 then
      over = math.min(over, budget)
      local taken = history_lives(rec_key, batch_key, first, over)
      return {step = 'count', taken = taken, over = over, more = true,
              tasks = history_taken_tasks(taken, {})}
    end
  end
  local cursor = redis.call('GET', cursor_key)
  local from = cursor and ('(' .. cursor) or '-inf'
  -- a page of `head` batches, and the score of the one after it (nil: none)
  local page = redis.call('ZRANGEBYSCORE', hist_key, from, now, 'WITHSCORES', 'LIMIT', 0,
    head + 1)
  local after = page[2 * head + 2]
  local unindexed, scores, last_score = {}, {}, nil
  for i = 1, math.min(#page, 2 * head), 2 do
    local member = page[i]
    last_score = page[i + 1]
    if string.sub(member, 1, 2) ~= '::' then
      unindexed[#unindexed + 1] = member
      scores[#unindexed] = page[i + 1]
    end
  end
  local taken = history_lives(rec_key, batch_key, unindexed, budget)
  local whole = #taken == #unindexed
  local moved  -- the score through which every batch is indexed after this step
  if whole and not after then
    moved = now - 1  -- (a batch may still be written at `now`)
  else
    -- the last score taken, or the one before when the next batch has it too
    local last = tonumber(whole and last_score or scores[#taken])
    local next_score = tonumber(whole and after or scores[#taken + 1])
    moved = next_score == last and last - 1 or last
    if cursor and moved <= tonumber(cursor) then moved = last end
  end
  if cursor and moved <= tonumber(cursor) and #taken == 0 then return nil end
  return {step = 'index', taken = taken, cursor = string.format('%.0f', moved),
          more = not (whole and not after), tasks = history_taken_tasks(taken, {})}
end

-- Do a history_plan: the records dropped or indexed.
local function history_upkeep(hist_key, exp_key, rec_key, batch_key, cursor_key, plan)
  if plan.step == 'index' then
    local n = 0
    for _, one in ipairs(plan.taken) do
      history_reindex(hist_key, one[2], one[5], false)
      n = n + #one[2]
    end
    redis.call('SET', cursor_key, plan.cursor)
    return n
  end
  return history_drop(hist_key, exp_key, rec_key, batch_key, plan.taken, plan.over)
end

-- Trim task zset `key` of `task` to `count`, popping at most `most` of its oldest ids:
-- each one's record is dropped if it is still this task's (the same id may have ended
-- since under another task). Their batches' index entries stay: a batch whose ids name no
-- record of it drops nothing more when the history trims reach it (history_lives), and
-- takes a dead end's failed zset entry with it. O(log n) per id popped, in a few commands.
local function history_task_trim(key, rec_key, task, count, most)
  local over = math.min(redis.call('ZCARD', key) - count, most)
  if over <= 0 then return end
  local popped = redis.call('ZPOPMIN', key, string.format('%d', over))
  local ids, gone = {}, {}
  for i = 1, #popped, 2 do ids[#ids + 1] = popped[i] end
  for first = 1, #ids, 1000 do
    local last = math.min(first + 999, #ids)
    local values = redis.call('HMGET', rec_key, unpack(ids, first, last))
    for i = 1, last - first + 1 do
      if values[i] and history_record_task(values[i]) == task then
        gone[#gone + 1] = ids[first + i - 1]
      end
    end
  end
  each_thousand('HDEL', rec_key, gone)
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
