-- history.lua: the run history and the per-task series, shared by finish.lua and
-- cancel.lua (put after flow.lua). timers/model/keys.py names the keys; timers/model/wire.py is the
-- codec of both values (HistoryRecord, MinuteSlot): the scripts only check their shape.
--
-- The history is indexed by batch, not by record: a finish call writes one batch per
-- distinct age among the records it keeps (usually one), a cancel a batch of one. Per
-- record, only its HSET field is written; per batch, one entry in each zset and one in
-- P|histb. A batch id is ":<n>" (no escaped id holds ':'), n a number of the keyspace's
-- sequence (P|seq, which numbers run tokens): a finish batch's is its first run's token
-- (a run ends once), a cancel's is drawn from the sequence; so no two batches share one.
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
--   P|series    hash  "<task>|<minute mod 1440>" -> "<minute> <runs> <failures>
--                     l<bucket>=<n>,... d<bucket>=<n>,...": a ring of minute slots per
--                     task (lateness and duration histograms); a slot of an older minute
--                     is overwritten, so its size is fixed
--   P|seriest   hash  task -> the last minute written: the tasks that have a series
--
-- The previous release indexed each record: P|hist and P|histexp members that are escaped
-- ids (no ':' first), their P|histrec values without a batch prefix. Those still read, and
-- are trimmed as batches of one (their record is dropped unless a newer end rewrote it).

local SERIES_SLOTS = 1440

-- Whether a series slot text reads.
local function series_text_ok(text)
  return string.match(text, '^%d+ %d+ %d+ l[%d=,]* d[%d=,]*$') ~= nil
end

-- The id of a new batch: named after `token`, a run token of the batch (a number of
-- `seq_key`), else (`token` nil or not a number) a number drawn from `seq_key`.
local function history_batch(seq_key, token)
  if token and string.match(token, '^%d+$') then return ':' .. token end
  return ':' .. string.format('%.0f', redis.call('INCR', seq_key))
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

-- Run `command` on `key` with ids[first..last] as its arguments, a thousand at a time
-- (unpack's stack is bounded).
local function each_thousand(command, key, ids)
  for first = 1, #ids, 1000 do
    redis.call(command, key, unpack(ids, first, math.min(first + 999, #ids)))
  end
end

-- The ids of index member `member` whose record it still names: a batch's (read from
-- P|histb), or for a member of the previous release's index (an escaped id), that id
-- unless a newer end rewrote its record with a batch prefix.
local function history_live(rec_key, batch_key, member)
  local live = {}
  if string.sub(member, 1, 1) ~= ':' then
    local text = redis.call('HGET', rec_key, member)
    if text and string.sub(text, 1, 1) ~= ':' then live[1] = member end
    return live
  end
  local ids_text = redis.call('HGET', batch_key, member)
  if not ids_text then return live end
  local ids = {}
  for id in string.gmatch(ids_text, '[^:]+') do ids[#ids + 1] = id end
  local prefix = member .. '|'
  local n = #prefix
  for first = 1, #ids, 1000 do
    local last = math.min(first + 999, #ids)
    local values = redis.call('HMGET', rec_key, unpack(ids, first, last))
    for i = 1, last - first + 1 do
      local value = values[i]
      if value and string.sub(value, 1, n) == prefix then live[#live + 1] = ids[first + i - 1] end
    end
  end
  return live
end

-- Drop index member `member` and its live records, or, with `most` less than its live
-- records, only its first `most` (the member stays, naming the rest). The number of
-- records dropped, and the work done (ids looked at).
local function history_drop(hist_key, exp_key, rec_key, batch_key, member, most)
  local live = history_live(rec_key, batch_key, member)
  if most and most < #live then
    local rest = {}
    for i = most + 1, #live do rest[#rest + 1] = live[i] end
    for i = #live, most + 1, -1 do live[i] = nil end
    each_thousand('HDEL', rec_key, live)
    redis.call('HSET', batch_key, member, table.concat(rest, ':'))
    return #live, #live + #rest
  end
  each_thousand('HDEL', rec_key, live)
  redis.call('ZREM', hist_key, member)
  redis.call('ZREM', exp_key, member)
  redis.call('HDEL', batch_key, member)
  return #live, math.max(#live, 1)
end

-- Drop records whose expiry has come, then records over count (oldest end first, whatever
-- their age), looking at about `budget` records for each: whole batches past their expiry,
-- and for the count, the oldest batches (the last one in part, so the count holds
-- exactly). O(log n) per batch plus O(1) per record, so a call's cost is bounded however
-- long the history.
local function history_trim(hist_key, exp_key, rec_key, batch_key, now, count, budget)
  local work = 0
  local old = redis.call('ZRANGEBYSCORE', exp_key, '-inf', now, 'LIMIT', 0, budget)
  for _, member in ipairs(old) do
    if work >= budget then break end
    local _, looked = history_drop(hist_key, exp_key, rec_key, batch_key, member, nil)
    work = work + looked
  end
  local over = redis.call('HLEN', rec_key) - count
  work = 0
  while over > 0 and work < budget do
    local head = redis.call('ZRANGE', hist_key, 0, 0)
    if #head == 0 then break end
    local dropped, looked = history_drop(hist_key, exp_key, rec_key, batch_key, head[1], over)
    over = over - dropped
    work = work + looked
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
