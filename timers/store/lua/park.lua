#!lua
-- park.lua: put a backlog of due timers that have a concurrency key into their key's
-- queue without claiming them, and let the head of each queue go (flow.lua has the queue
-- states). A burst of timers for a few keys would otherwise be claimed and gated a
-- listener's free slots at a time, each timer a claim and a gate away from its queue: a
-- near-full listener takes hundreds of round trips over it, and timers of a key not yet
-- seen wait behind the whole backlog. The listener reads the backlog with "peek", works
-- out each timer's key (a task's key is a function of its args, in Python) and parks
-- them in one call with "park": each goes into its key's queue (by priority, then due
-- time, its lateness counting from its due time), then each key with free slots promotes
-- the head of its queue at once, exactly as a gate that held them and a freed slot would.
-- Claims then take the promoted timers first (due index score 0), one per free slot.
-- State machine: docs/state-machine.md (transitions T6).
--
-- KEYS[1]  due index: zset, escaped id -> due ms (the plain one; see prelude.lua)
-- KEYS[2]  records: hash, escaped id -> record
-- KEYS[3]  stats: hash of counters
-- KEYS[4..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys);
--          "floor" sends the order barrier of each task (P|ungated|t:<task>) before them
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  mode: "peek", "park" or "floor"
-- ARGV[3]  peek: the most timers to read; park: lease ms of a slot kept for a promoted one
-- ARGV[4]  peek: the groups served, joined by ","; park: the wake channel
-- ARGV[5..] park: four values per timer: id, the record read, concurrency key, its limit
-- floor: ARGV[3] the groups served, ARGV[4..] the keyed tasks; returns a due ms (below)
-- peek returns {id, due ms, record, ...}: timers due now in the served groups' due
-- indexes, highest priority first, none that a flow gate holds already. park returns how
-- many it parked; a timer is skipped unless it is still pending under that record, due,
-- and in no flow queue.
-- No allow-oom flag: parking writes. Arguments are checked before the first write.
local now = redis_now()
local parked_key = sys_key(ARGV[1], 'parked')

if ARGV[2] == 'peek' then
  if not is_count(ARGV[3]) then return redis.error_reply('ERR timers park: bad limit') end
  local limit = tonumber(ARGV[3])
  local served = {}
  for group in string.gmatch(ARGV[4] or '', '[^,]+') do served[group] = true end
  -- declare {
  for _, index in ipairs(served_due_indexes(KEYS[1], ARGV[1], served)) do need(index[1]) end
  local asked = keys_asked()
  if asked then return asked end
  -- declare }
  local out = {}
  for _, index in ipairs(served_due_indexes(KEYS[1], ARGV[1], served)) do
    if #out >= 3 * limit then break end
    local due = redis.call('ZRANGEBYSCORE', index[1], '-inf', now, 'WITHSCORES',
      'LIMIT', 0, limit - #out / 3)
    for i = 1, #due, 2 do
      local record = redis.call('HGET', KEYS[2], due[i])
      if record and redis.call('HEXISTS', parked_key, due[i]) == 0 then
        out[#out + 1], out[#out + 2], out[#out + 3] = due[i], due[i + 1], record
      end
    end
  end
  return out
end

if ARGV[2] == 'floor' then
  -- How far this shard's timers of the keyed tasks ARGV[4..] have all entered their keys'
  -- order (docs/state-machine.md, Cluster, rule 5): the earliest due time of such a timer
  -- (no key of its own) pending in the served groups' due indexes (ARGV[3]) and in no flow
  -- queue, or claimed and not gated yet (the order barrier; a stale entry is dropped as
  -- flow.lua barred drops it). A due index is read from its head FLOOR_READ timers at a
  -- time, at most FLOOR_PAGES times: past that, the due time reached (they may be later).
  -- FLOW_DUE_SPAN when there is none.
  local served, tasks = {}, {}
  for group in string.gmatch(ARGV[3] or '', '[^,]+') do served[group] = true end
  for i = 4, #ARGV do tasks[ARGV[i]] = true end
  -- declare {
  for _, index in ipairs(served_due_indexes(KEYS[1], ARGV[1], served)) do need(index[1]) end
  for i = 4, #ARGV do need_barrier(ARGV[1], ARGV[i] .. ':null') end
  local asked = keys_asked()
  if asked then return asked end
  -- declare }
  local FLOOR_READ, FLOOR_PAGES = 25, 4
  local floor = FLOW_DUE_SPAN
  for _, index in ipairs(served_due_indexes(KEYS[1], ARGV[1], served)) do
    for page = 0, FLOOR_PAGES - 1 do
      local due = redis.call('ZRANGE', index[1], page * FLOOR_READ,
        (page + 1) * FLOOR_READ - 1, 'WITHSCORES')
      local stop = #due < 2 * FLOOR_READ or tonumber(due[2]) >= floor
      for i = 1, #due, 2 do
        local score = tonumber(due[i + 1])
        if score >= floor then stop = true; break end
        local record = redis.call('HGET', KEYS[2], due[i])
        if record and tasks[record_task(record)] and not record_option(record, 'k')
            and redis.call('HEXISTS', parked_key, due[i]) == 0 then
          floor, stop = score, true
          break
        end
      end
      if not stop and page == FLOOR_PAGES - 1 then
        floor = math.min(floor, tonumber(due[#due]))  -- read no further
      end
      if stop then break end
    end
  end
  -- Of each task's order barrier, the first entry not held for its rate: a timer waiting
  -- for its rate (`r|`) has entered its limit's order, here (a task's rate places its
  -- timers in one shard), so it holds nothing back elsewhere. (Counted at its own due
  -- time, before the slot its rate's pacer is pending at, it held the other shards' timers
  -- due in between, for as long as its rate's queue took to drain.) Past FLOOR_READ *
  -- FLOOR_PAGES entries held for their rate, the due time reached.
  local notes = sys_key(ARGV[1], 'ungatedt')
  for i = 4, #ARGV do
    local record = ARGV[i] .. ':null'
    if barred(ARGV[1], '', record, math.huge, now) then  -- (a stale head dropped)
      local entries = redis.call('ZRANGE', flow_key(ARGV[1], 'ungated', barrier_of(record)),
        0, FLOOR_READ * FLOOR_PAGES - 1, 'WITHSCORES')
      for j = 1, #entries, 2 do
        local due = math.fmod(tonumber(entries[j + 1]), FLOW_DUE_SPAN)
        local note = redis.call('HGET', notes, entries[j])
        if not note or string.sub(note, 1, 2) ~= 'r|'
            or (j == #entries - 1 and #entries == 2 * FLOOR_READ * FLOOR_PAGES) then
          floor = math.min(floor, due)
          break
        end
      end
    end
  end
  return string.format('%.0f', floor)
end

local FIRST = 5  -- the first timer's first value
if ARGV[2] ~= 'park' or not is_count(ARGV[3]) or (#ARGV - FIRST + 1) % 4 ~= 0 then
  return redis.error_reply('ERR timers park: bad arguments')
end
for i = FIRST, #ARGV, 4 do
  if ARGV[i] == '' or ARGV[i + 2] == '' or not string.match(ARGV[i + 3], '^[1-9]%d*$') then
    return redis.error_reply('ERR timers park: bad timer ' .. ((i - FIRST) / 4 + 1))
  end
end

-- declare {
for i = FIRST, #ARGV, 4 do  -- each timer's due index and key; as it waits, if promoted
  local id, record = ARGV[i], ARGV[i + 1]
  if redis.call('HGET', KEYS[2], id) == record then
    local index = (due_key_for(KEYS[1], record))
    need_timer(ARGV[1], id, record)
    need_barrier(ARGV[1], record)  -- a note of its place there goes (handed back: T17)
    local due = need(index) and tonumber(redis.call('ZSCORE', index, id) or '')
    if due then need_promoted(ARGV[1], id, with_waited_from(record, due)) end
  end
  need_key(ARGV[1], ARGV[i + 2], tonumber(ARGV[i + 3]))
end
local asked = keys_asked()
if asked then return asked end
-- declare }
local lease = tonumber(ARGV[3])
local parked = 0

local touched = {}

local function park(id, record, key, limit)
  if redis.call('HGET', KEYS[2], id) ~= record
      or redis.call('HEXISTS', parked_key, id) == 1 then return end
  local index = due_key_for(KEYS[1], record)
  local due = tonumber(redis.call('ZSCORE', index, id) or '')
  if not due or due > now then return end
  redis.call('ZREM', index, id)
  redis.call('DEL', ARGV[1] .. id .. ':' .. record)
  -- its key's queue keeps its place now, as gate's hold does: a note of it in the order
  -- barrier (handed back unstarted, T17) goes, else nothing drops it once a run handed
  -- over from the queue holding the slot (no gate) has run it
  drop_ungated(ARGV[1], id, record)
  local waiting = with_waited_from(record, due)
  redis.call('HSET', KEYS[2], id, waiting)
  redis.call('ZADD', flow_key(ARGV[1], 'waitk', key),
    flow_score(waiting, tonumber(record_option(waiting, 'w'))), id)
  parked_write(ARGV[1], id, {state = 'c', a = limit, b = lease, c = 0, name = key})
  touched[key] = limit
  parked = parked + 1
end

for i = FIRST, #ARGV, 4 do
  park(ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]))
end
for key, limit in pairs(touched) do promote_key(ARGV[1], key, limit, now) end
if parked > 0 then redis.call('HINCRBY', KEYS[3], 'waited', parked) end
wake(ARGV[4])
return parked
