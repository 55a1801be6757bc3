#!lua
-- schedule.lua: add timers, or replace pending timers that have the same id.
-- State machine: docs/state-machine.md (transitions T1).
--
-- KEYS[1]    due index: zset, escaped id -> due ms (Redis clock)
-- KEYS[2]    records: hash, escaped id -> record "task[;opts]:args"
-- KEYS[2+i]  the new expiring key of timer i ("<prefix>:<id>:<record>")
-- KEYS[3+n..] shared keys: of timers/model/keys.py Keyspace.script_keys, those the call's
--            timers may touch (timers/store/scripts.py schedule_key_names): "P|near";
--            "P|queues" if one has a group or priority; all the helpers name if one
--            may replace ("r"), which may pass a held slot on
-- ARGV[1]    timer key start "<prefix>:"
-- ARGV[2]    wake channel
-- ARGV[3..]  five values per timer i, in the order of KEYS[2+i]: escaped id, record,
--            mode ("in": ms from now | "at": epoch ms, 0 or later), ms (an integer), and
--            "r" to replace a pending timer with the same id, "n" to refuse it (generated
--            ids must be new) or "k" to keep whatever is pending under that id
--
-- No allow-oom flag: it needs memory, so a full server refuses it before it starts.
-- Every timer is checked before the first write: one bad value fails the whole call and
-- writes nothing. An "in" due time before 1970 counts as 0 (due at once).
-- The previous key of a replaced timer is named by its stored record, which the caller
-- cannot know without a read; it is built here from ARGV[1] (same prefix, so the same
-- hash tag). The due time comes from Redis TIME, never from a client clock. A timer due
-- now or earlier gets no expiring key: the wake below makes a sweeper fire it at once.
-- The wake is a PUBLISH by pcall: a user who may not publish still schedules.
-- Returns {now_ms, due_1, ..., due_n}; due_i is nil where "n" refused an id that is
-- pending with another record (the same record means this very call was retried: its
-- due time is returned), or where "k" found the id pending.
-- With several timers, the new ones (ids not pending, each met once) are written as a
-- batch, the others one by one after it (see below): the same as one call per timer.
local call, find, tonumber = redis.call, string.find, tonumber  -- (a global read costs more)
local now = redis_now()
local n = math.floor((#ARGV - 2) / 5)
if #ARGV ~= 2 + 5 * n or #KEYS < 2 + n then
  return redis.error_reply('ERR timers schedule: ' .. #ARGV .. ' args for ' .. (#KEYS - 2) ..
    ' keys')
end
local dues = {}
for i = 1, n do
  local base = 2 + (i - 1) * 5
  local id, record, mode, ms, how =
    ARGV[base + 1], ARGV[base + 2], ARGV[base + 3], ARGV[base + 4], ARGV[base + 5]
  local due = tonumber(ms)  -- an integer: a whole number (% 1 is nan for nan and inf)
  if id == '' or find(id, ':', 1, true) or not find(record, ':', 1, true)
      or (mode ~= 'in' and mode ~= 'at') or not due or due % 1 ~= 0
      or (how ~= 'r' and how ~= 'n' and how ~= 'k') then
    return redis.error_reply('ERR timers schedule: bad timer ' .. i .. ' (' .. id .. ')')
  end
  if mode == 'in' then
    due = now + due
    if due < 0 then due = 0 end
  elseif due < 0 then
    return redis.error_reply('ERR timers schedule: due time before 1970 for ' .. id)
  end
  dues[i] = due
end

-- declare {
for i = 1, n do  -- each timer's due index; the keys of one it replaces, and its queue
  local base = 2 + (i - 1) * 5
  local id = ARGV[base + 1]
  need((due_key_for(KEYS[1], ARGV[base + 2])))
  local old = ARGV[base + 5] == 'r' and call('HGET', KEYS[2], id)
  if old then
    need_timer(ARGV[1], id, old)
    need_unpark(ARGV[1], id)
  end
end
local asked = keys_asked()
if asked then return asked end
-- declare }
-- The records pending under the call's ids, read in one HMGET when it holds several
-- timers: each timer whose id is not pending and not met before in the call is then
-- pended in a batch (prelude.lua pend_batch), its record and due entry written with the
-- others': a command has a fixed cost in Redis, so an element of a large HSET or ZADD
-- costs less than an HSETNX or a ZADD of its own, and an element of an HMGET little
-- (figures: bench/FINDINGS.md, "Redis instructions in the scripts").
-- The rest follow one by one, after the batch is written: a later timer with the id of
-- a batched one finds its record.
local olds, batch, seen = nil, nil, nil
if n > 1 then
  local ids = {}
  for i = 1, n do ids[i] = ARGV[2 + (i - 1) * 5 + 1] end
  olds, batch, seen = {}, pend_batch(), {}
  for first = 1, n, 1000 do
    local read = call('HMGET', KEYS[2], unpack(ids, first, math.min(first + 999, n)))
    for j = 1, #read do olds[first + j - 1] = read[j] end
  end
end
local out, later = {now}, {}
for i = 1, n do
  local base = 2 + (i - 1) * 5
  local id = ARGV[base + 1]
  if batch and not olds[i] and not seen[id] then
    seen[id] = true
    pend(KEYS[1], KEYS[2], ARGV[1], id, ARGV[base + 2], dues[i], now, KEYS[2 + i], false,
      false, batch)
    out[1 + i] = dues[i]
  else
    if seen then seen[id] = true end
    later[#later + 1] = i
  end
end
if batch then pend_flush(KEYS[2], batch) end
for _, i in ipairs(later) do
  local base = 2 + (i - 1) * 5
  local id, record, how = ARGV[base + 1], ARGV[base + 2], ARGV[base + 5]
  if how == 'r' then
    local old = call('HGET', KEYS[2], id)
    if old then unpark(ARGV[1], id) end
    pend(KEYS[1], KEYS[2], ARGV[1], id, record, dues[i], now, KEYS[2 + i], old)
    out[1 + i] = dues[i]
  elseif call('HSETNX', KEYS[2], id, record) == 1 then  -- new: its record written
    pend(KEYS[1], KEYS[2], ARGV[1], id, record, dues[i], now, KEYS[2 + i], false, true)
    out[1 + i] = dues[i]
  elseif how == 'n' and call('HGET', KEYS[2], id) == record then
    -- this very call, retried: the due time in its record's due index (now if it has
    -- none: claimed and held back by a flow gate, so it was due)
    out[1 + i] = tonumber(call('ZSCORE', (due_key_for(KEYS[1], record)), id)) or now
  else
    out[1 + i] = false  -- "k", or "n" meeting another timer's id
  end
end
wake(ARGV[2])
return out
