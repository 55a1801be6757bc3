-- prelude.lua: helpers shared by every script. timers/store/scripts.py puts this text right
-- after each script's "#!lua ..." shebang line when it loads the script; a script's own
-- header (its KEYS and ARGV) follows it.
--
-- A timer is three things (see timers/model/keys.py): an entry in the due index (escaped id ->
-- due ms), its record (escaped id -> record) and, while it is due later than now and
-- within the near horizon (below), its expiring key "<prefix>:<id>:<record>". That key
-- is named by the stored record, so the helpers build it from the timer key start "<prefix>:" (same prefix, same hash tag).

-- Redis time: now in ms, and in µs.
local function redis_now()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- Run tokens (the fencing tokens tasks read): `n` new ones from the counter `seq_key`,
-- returned as the number before the first (the tokens are base + 1 .. base + n). None is
-- below the Redis clock in µs (`now_us`), so a server that lost its last writes (a restart
-- without them, a failover to a replica that was behind) never gives a token out again,
-- nor one below a token it gave: the counter alone went back with the lost writes.
local function new_tokens(seq_key, n, now_us)
  local base = tonumber(redis.call('GET', seq_key) or '0') or 0
  if base < now_us then base = now_us end
  redis.call('SET', seq_key, string.format('%.0f', base + n))
  return base
end

-- Whether a value is an integer (is_int) or an integer of 0 or more (is_count).
local function is_int(value)
  return string.match(value or '', '^%-?%d+$') ~= nil
end

local function is_count(value)
  return string.match(value or '', '^%d+$') ~= nil
end

-- An error reply naming the first of ARGV[i], i in indexes, that is not an integer, or
-- nil: a script checks its numbers before its first write.
local function not_ints(script, indexes)
  for _, i in ipairs(indexes) do
    if not is_int(ARGV[i]) then
      return redis.error_reply('ERR timers ' .. script .. ': ARGV[' .. i ..
        '] is not an integer')
    end
  end
  return nil
end

-- The due ms at the head of a due index, or nil when it is empty. The ranks are text: a
-- number argument of redis.call costs Redis a snprintf("%.17g")
-- (figures: bench/FINDINGS.md, "Redis instructions in the scripts").
local function head_due(due_key)
  local head = redis.call('ZRANGE', due_key, '0', '0', 'WITHSCORES')
  return head[2] and tonumber(head[2])
end

-- Run `command` on `key` with ids[first..last] as its arguments, a thousand at a time
-- (unpack's stack is bounded).
local function each_thousand(command, key, ids)
  for first = 1, #ids, 1000 do
    redis.call(command, key, unpack(ids, first, math.min(first + 999, #ids)))
  end
end

-- Groups and priorities (timers/model/keys.py names the same keys). A record's options
-- ";g=<group>" and ";p=<priority>" say which due index holds it: the default group at
-- priority 0 uses the plain due index "P|due"; any other pair uses "P|due|<group>|<p>",
-- listed in the set "P|queues" as "<group>|<p>" so a claim finds it without a SCAN. A
-- group's runs are leased in "P|run" (default) or "P|run|<group>": a listener recovers
-- only runs of the groups it serves. Scripts name these keys from the plain due index or
-- running key they are given, or from the timer key start "P:" (same prefix, same hash tag).
local DEFAULT_GROUP = 'default'

-- The value of option `name` in a record "task;opt=value;...:args", or nil.
local function record_option(record, name)
  local head = string.match(record, '^[^:]*')
  return string.match(head, ';' .. name .. '=([^;]*)')
end

local function record_group(record)
  if not string.find(record, ';g=', 1, true) then return DEFAULT_GROUP end  -- most do not
  local group = record_option(record, 'g')
  if not group or group == '' then return DEFAULT_GROUP end
  return group
end

-- An integer in -1000..1000 (anything else reads as 0).
local function record_priority(record)
  local p = tonumber(record_option(record, 'p') or '0')
  if not p or p ~= math.floor(p) or p < -1000 or p > 1000 then return 0 end
  return p
end

-- The system key "P|<name>" of the prefix whose timer keys start with key_start ("P:").
-- Built from the prefix, not looked up: a script that calls this is given the key among
-- its KEYS all the same (timers/store/scripts.py declares, per script, the keys of
-- timers/model/keys.py Keyspace.script_keys its code names here; on Redis Cluster only
-- KEYS are checked before a script runs, and tests/unit/declared_keys.py fails any
-- script that touches a key it was not given). A scan of KEYS for it would cost every
-- call that builds one (figures: bench/FINDINGS.md, "Keys a script is given").
local function sys_key(key_start, name)
  return string.sub(key_start, 1, -2) .. '|' .. name
end

-- A flow key "P|<family>|<name>" (a concurrency key's slots or queue, a rate's state or
-- queue, an order barrier): named after data only a script reads (a record, a held
-- slot), so built here, in the keyspace's hash tag. Where keys are checked (Redis
-- Cluster), a script asks for those it needs before its first write (declare.lua).
local function flow_key(key_start, family, name)
  return string.sub(key_start, 1, -2) .. '|' .. family .. '|' .. name
end

-- The due index that holds `record`, given the plain one, and its "<group>|<p>" name in
-- the queues set (nil for the plain one).
local function due_key_for(due_key, record)
  if not string.find(record, ';', 1, true) or not (string.find(record, ';g=', 1, true)
      or string.find(record, ';p=', 1, true)) then
    return due_key, nil  -- most timers: one plain find (a C call costs Redis, a pattern more)
  end                    -- (figures: bench/FINDINGS.md, "Redis instructions in the scripts")
  local group, priority = record_group(record), record_priority(record)
  if group == DEFAULT_GROUP and priority == 0 then return due_key, nil end
  local queue = group .. '|' .. string.format('%d', priority)
  return due_key .. '|' .. queue, queue
end

-- The due indexes of the groups in `served` (a set), highest priority first: {key,
-- priority, "<group>|<p>" name in the queues set or nil}, given the plain due index.
local function served_due_indexes(due_key, key_start, served)
  local indexes = {}
  if served[DEFAULT_GROUP] then indexes[1] = {due_key, 0, nil} end
  for _, queue in ipairs(redis.call('SMEMBERS', sys_key(key_start, 'queues'))) do
    local group, priority = string.match(queue, '^(.+)|(%-?%d+)$')
    if group and served[group] then
      indexes[#indexes + 1] = {due_key .. '|' .. queue, tonumber(priority), queue}
    end
  end
  table.sort(indexes, function(a, b)
    if a[2] ~= b[2] then return a[2] > b[2] end
    return a[1] < b[1]
  end)
  return indexes
end

local function running_key_for(running_key, group)
  if group == DEFAULT_GROUP then return running_key end
  return running_key .. '|' .. group
end

-- A run record "reruns@<listener>|due|<id>:<record>": reruns, listener, due, id, record.
local function run_read(run)
  return string.match(run or '', '^(%d+)@?([^|]*)|(%-?%d+)|([^:]+):(.*)$')
end

-- Wakes: pend() notes the earliest due time that went ahead of its due index's head (as
-- read before this script added to it); wake() publishes it once, by pcall: a user who
-- may not publish still writes.
local index_heads = {}
local wake_due = nil

local function note_head(index, due)
  if index_heads[index] == nil then index_heads[index] = head_due(index) or false end
  local head = index_heads[index]
  if head == false or due < head then
    index_heads[index] = due
    if not wake_due or due < wake_due then wake_due = due end
  end
end

local function wake(channel)
  if wake_due then redis.pcall('PUBLISH', channel, string.format('%.0f', wake_due)) end
end

-- Withdraw a pending timer: out of its due index and the records, its expiring key
-- deleted. Returns its record, or false when it was not pending. A timer held back by a
-- flow gate is not in a due index: the caller takes it out of its queue (unpark).
local function withdraw(due_key, records_key, key_start, id)
  local record = redis.call('HGET', records_key, id)
  if not record then return false end
  redis.call('ZREM', (due_key_for(due_key, record)), id)
  redis.call('HDEL', records_key, id)
  redis.call('DEL', key_start .. id .. ':' .. record)
  return record
end

-- The near horizon: only timers due within this many ms from now have their expiring key;
-- those due later live in their due index and the records alone (half the memory, and
-- Redis's active expiry samples only near keys, so their events come on time), and
-- near.lua writes their keys as they come within it. "<prefix>|near" field "horizon"
-- overrides the default (timers/model/wire.py NEAR_HORIZON_MS, the same value).
local NEAR_HORIZON_MS = 3600000
local near_horizon_ms = nil

local function near_horizon(key_start)
  if not near_horizon_ms then
    local set = redis.call('HGET', sys_key(key_start, 'near'), 'horizon')
    near_horizon_ms = is_count(set) and tonumber(set) or NEAR_HORIZON_MS
  end
  return near_horizon_ms
end

-- Set a pending timer's expiring key when it is due after now and within the horizon
-- (`due_text`: `due` formatted, when the caller has it).
local function set_near_key(key_start, key, due, now, due_text)
  if due <= now or due > now + (near_horizon_ms or near_horizon(key_start)) then
    return false
  end
  redis.call('SET', key, '1', 'PXAT', due_text or string.format('%.0f', due))
  return true
end

-- Pend a timer: `record` under `id`, due at `due` ms (replacing another record pending
-- under that id, whose key goes), with its expiring key `key` (default: built from
-- key_start) set when it is due later than now and within the near horizon, in the due
-- index its record names (given the plain one). The caller calls wake() once it has
-- pended what it pends. `known` is the record pending under `id` when the caller has
-- just read it (false: none), so it is not read twice; nil: pend reads it. `stored`: the
-- caller has just written `record` under `id` where none was (HSETNX; `known` false).
-- `batch` (pend_batch()): the record and the due entry are added to it, written by
-- pend_flush() with one command per key rather than two per timer; a caller batches
-- only timers whose ids are distinct and not pending, and flushes before anything
-- else reads or writes them.
local function pend(due_key, records_key, key_start, id, record, due, now, key, known, stored,
                    batch)
  local old = known
  if old == nil then old = redis.call('HGET', records_key, id) end
  if old ~= record then
    if old then redis.call('DEL', key_start .. id .. ':' .. old) end
    if batch then
      local records = batch.records
      records[#records + 1], records[#records + 2] = id, record
    elseif not stored then
      redis.call('HSET', records_key, id, record)
    end
  end
  key = key or (key_start .. id .. ':' .. record)
  local due_text = (due % 1 == 0 and due > -1e15 and due < 1e15)  -- a whole number: its
    and string.format('%d', due) or string.format('%.0f', due)  -- digits (%d: %.0f costs more)
  -- (figures: bench/FINDINGS.md, "Redis instructions in the scripts")
  if set_near_key(key_start, key, due, now, due_text) then
  elseif old == record then
    redis.call('DEL', key)
  end
  local index, queue = due_key_for(due_key, record)
  if old and old ~= record then  -- a record of another group or priority moves index
    local old_index = due_key_for(due_key, old)
    if old_index ~= index then redis.call('ZREM', old_index, id) end
  end
  if queue then redis.call('SADD', sys_key(key_start, 'queues'), queue) end
  note_head(index, due)
  if batch then
    local entries = batch.entries[index]
    if not entries then
      entries = {}
      batch.entries[index] = entries
      batch.indexes[#batch.indexes + 1] = index
    end
    entries[#entries + 1], entries[#entries + 2] = due_text, id
  else
    redis.call('ZADD', index, due_text, id)
  end
end

-- An empty batch for pend(): records (id, record pairs), and per due index its entries
-- (due, id pairs), the indexes in the order first met.
local function pend_batch()
  return {records = {}, entries = {}, indexes = {}}
end

-- Write what pend() added to `batch`: one HSET of the records, one ZADD per due index (a
-- thousand arguments a command).
local function pend_flush(records_key, batch)
  each_thousand('HSET', records_key, batch.records)  -- field, value pairs: 1000 is even
  for _, index in ipairs(batch.indexes) do
    each_thousand('ZADD', index, batch.entries[index])  -- score, member pairs
  end
end

-- A recurrence state "v|last|prev|paused|run|anchor" (timers/model/cron/state.py reads the same
-- format): a table of its six fields as text, or nil when missing or unreadable.
local function state_read(raw)
  if not raw then return nil end
  local v, last, prev, paused, run, anchor =
    string.match(raw, '^(%d+)|(%-?%d+)|(%-?%d+)|([01])|([^|]*)|(%-?%d+)$')
  if not v then return nil end
  return {v = v, last = last, prev = prev, paused = paused, run = run, anchor = anchor}
end

local function state_write(states_key, name, s)
  redis.call('HSET', states_key, name,
    table.concat({s.v, s.last, s.prev, s.paused, s.run, s.anchor}, '|'))
end

-- The pending occurrence of recurrence `name` (escaped) due at `due` (text).
local function occurrence(name, due)
  return name .. '@' .. due
end
