#!lua
-- claim.lua: take due timers for one listener to run, each under a lease.
-- State machine: docs/state-machine.md (transitions T4, T5).
--
-- KEYS[1]  due index: zset, escaped id -> due ms
-- KEYS[2]  records: hash, escaped id -> record
-- KEYS[3]  running: zset, run token -> lease deadline ms
-- KEYS[4]  running records: hash, run token -> "reruns@<listener>|due|<id>:<record>",
--          <listener> the id of the listener that claimed the run
-- KEYS[5]  sequence: counter that numbers run tokens
-- KEYS[6]  stats: hash of counters
-- KEYS[7]  arrival records: hash, "<from shard>|<token>" -> "<due>|<id>:<record>" (timers
--          moving into this shard; placer.py), read only with a floor (ARGV[8])
-- KEYS[8..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  limit: the most timers to claim
-- ARGV[3]  lease ms
-- ARGV[4]  horizon ms: also claim timers due within this long from now (the listener
--          holds them and starts each exactly at its due time)
-- ARGV[5]  the claiming listener's id (no '|'), kept in the run's record so the listener
--          that takes the run over after its lease lapsed can name the one that died
-- ARGV[6]  the groups the listener serves, joined by "," (each [A-Za-z0-9_.-]+)
-- ARGV[7]  the keyed tasks of its package (a concurrency key or cap), joined by ",": each
--          claimed timer of one of those, or with a key of its own (";k="), is noted as
--          claimed and not gated yet (flow.lua's order barrier)
-- ARGV[8]  "" or, on a prefix of several shards, the floor of the keyed tasks' timers
--          without a key of their own (";k="): the earliest due time that a timer of theirs
--          in another shard may have without having entered its limit's order yet (park.lua
--          "floor" of each other shard, the least); such a timer due later than the floor,
--          or than a timer moving into this shard (P|arrivingrec), is left pending: it
--          enters after those (docs/state-machine.md, Cluster, rule 5)
-- ARGV[9..] escaped ids named by expired events: claimed first, when due
--
-- Only timers of the served groups are claimed: those of the plain due index and running
-- set for "default", and "P|due|<group>|<priority>" / "P|run|<group>" for the others
-- (the queues set "P|queues" lists which exist; prelude.lua). Among due timers, higher
-- priority goes first; timers due within the horizon follow, earliest first.
-- Claims, in this order and up to the limit: the named ids that are due; runs whose lease
-- lapsed (their listener died or was paused past its lease: they run again with reruns + 1
-- under a new token, so the old listener can no longer finish them or start anything it
-- was handed along with them, and a slot of a concurrency key the cut run held passes to
-- the rerun, which goes first; flow.lua's transfer_slot); then the earliest due timers. Whoever calls
-- this first wins a timer; everyone else no longer sees it. A claimed timer's key is
-- deleted (it is named by the stored record, so built here from ARGV[1]): it will not
-- expire later and send listeners an event for a timer already taken.
-- No allow-oom flag: claims need memory, so a full server refuses the call before it
-- starts (the listener retries later). Limit, lease and horizon are checked before any
-- write.
-- Returns {now_us, next_due or -1, next_lease or -1, then per claim: token, run, source}
-- (next_due and next_lease over the served groups)
-- where source is "e" (event), "s" (sweep) or "r@<listener>" (recovered lease: the listener
-- that held it and died). A recovered run counts one more crash in its reruns: the listener
-- ends it as failed, not run, once its task's crash limit is reached.
for i = 2, 4 do
  if not is_count(ARGV[i]) then
    return redis.error_reply('ERR timers claim: bad limit, lease or horizon')
  end
end
local now, now_us = redis_now()
local limit = tonumber(ARGV[2])
local lease_until = string.format('%.0f', now + tonumber(ARGV[3]))
local horizon = now + tonumber(ARGV[4])
local out = {now_us, -1, -1}
local claimed = 0
local me = '@' .. string.gsub(ARGV[5] or '', '|', '_')
local served = {}
for group in string.gmatch(ARGV[6] or '', '[^,]+') do served[group] = true end
local keyed = {}
for task in string.gmatch(ARGV[7] or '', '[^,]+') do keyed[task] = true end
local any_keyed = next(keyed) ~= nil
local floor = ARGV[8] ~= '' and tonumber(ARGV[8]) or nil
if ARGV[8] ~= '' and not floor then
  return redis.error_reply('ERR timers claim: bad floor')
end
-- Where keys are checked: whether a claimed timer's expiring key was given (a timer whose
-- key was not is left for the next claim; see the declare part below); nil elsewhere.
local only_declared = nil

-- Note a claimed keyed timer (a keyed task's, or one with a key of its own) as claimed and
-- not gated yet (flow.lua's order barrier).
local function note_keyed(token, run)
  if any_keyed or string.find(run, ';k=', 1, true) then
    local _, _, due, id, record = run_read(run)
    if record and (keyed[record_task(record)] or record_option(record, 'k')) then
      note_ungated(ARGV[1], id, token, record,
        tonumber(record_option(record, 'w') or due) or 0)
    end
  end
end

-- Whether a pending timer of a keyed task (no key of its own) due at `due` waits for the
-- floor (ARGV[8]): an earlier one of its task has not entered its limit's order yet. A
-- promoted timer (P|parked: a key's slot kept for it, or its rate's next slot) entered its
-- order when it was queued: it never waits (the rate's pacer, pending at its slot, would
-- wait for the other shards' timers due before that, which may wait for the timers its
-- rate holds: every claim stopped, Cluster rule 5).
local function below_floor(id, record, due)
  return floor ~= nil and tonumber(due) > floor and keyed[record_task(record)]
    and not record_option(record, 'k')
    and redis.call('HEXISTS', sys_key(ARGV[1], 'parked'), id) == 0
end

-- Whether a keyed timer named by an event (a keyed task's, or with a key of its own) would
-- go before a timer still pending ahead of it: one due earlier in a served due index, or
-- due by the horizon at a higher priority. Claimed by name it would take its key's slot
-- first (the earlier one, not claimed, is not in the key's order yet); left, this claim's
-- sweep takes it in its turn. (A claim after Redis refused claims, its memory full,
-- took the event's timer of a device before the 3 of its due during the refusal.)
local pending_heads = nil
local function jumps_queue(record, score)
  if not (keyed[record_task(record)] or record_option(record, 'k')) then return false end
  if not pending_heads then
    pending_heads = {}
    for _, index in ipairs(served_due_indexes(KEYS[1], ARGV[1], served)) do
      local head = head_due(index[1])
      if head then pending_heads[#pending_heads + 1] = {head, index[2]} end
    end
  end
  local priority = record_priority(record)
  for _, head in ipairs(pending_heads) do
    if head[1] < score or (head[2] > priority and head[1] <= horizon) then return true end
  end
  return false
end

local function start(run, source, group)
  local token = string.format('%.0f', new_tokens(KEYS[5], 1, now_us) + 1)
  redis.call('ZADD', running_key_for(KEYS[3], group), lease_until, token)
  redis.call('HSET', KEYS[4], token, run)
  out[#out + 1] = token
  out[#out + 1] = run
  out[#out + 1] = source
  claimed = claimed + 1
  note_keyed(token, run)
  return token
end

-- Send `values` as the arguments of one command (after `key`, if any), in as few calls as
-- Lua's stack lets unpack() pass.
local CHUNK = 2000  -- even: pairs stay together
local function call_all(command, key, values)
  for first = 1, #values, CHUNK do
    local last = math.min(first + CHUNK - 1, #values)
    if key then
      redis.call(command, key, unpack(values, first, last))
    else
      redis.call(command, unpack(values, first, last))
    end
  end
end

-- The replies of a command that answers one value per member, over `members`, chunked so.
local function read_all(command, key, members)
  local out = {}
  for first = 1, #members, CHUNK do
    local last = math.min(first + CHUNK - 1, #members)
    local got = redis.call(command, key, unpack(members, first, last))
    for i = 1, #got do out[first + i - 1] = got[i] end
  end
  return out
end

local function append(lists, name, ...)
  local list = lists[name]
  if not list then list = {}; lists[name] = list end
  for i = 1, select('#', ...) do list[#list + 1] = select(i, ...) end
end

-- Claim pending timers, each {id, due text, source, record}: each out of its due index
-- and the records, its expiring key deleted, and started under a new token (T4, T5): a
-- few calls for them all, not seven per timer. `stale`: ids of due index `index` that
-- have no record, dropped from it.
local function take_all(takes, index, stale)
  local n = #takes
  local zrem, leases = {}, {}
  if stale then for _, id in ipairs(stale) do append(zrem, index, id) end end
  if n == 0 then
    for key, ids in pairs(zrem) do call_all('ZREM', key, ids) end
    return
  end
  local first = new_tokens(KEYS[5], n, now_us)
  local ids, timer_keys, runs = {}, {}, {}
  for i, t in ipairs(takes) do
    local id, due_text, record = t[1], t[2], t[4]
    append(zrem, (due_key_for(KEYS[1], record)), id)
    ids[i] = id
    timer_keys[i] = ARGV[1] .. id .. ':' .. record
    -- a timer promoted from a key's queue sits at score 0 (claimed first): its run is due
    -- at the due time it had (";w="), so its listener waits if that has not come yet
    local waited_from = tonumber(record_option(record, 'w') or '')
    if waited_from and waited_from > tonumber(due_text) then
      due_text = string.format('%.0f', waited_from)
    end
    local run = record_reruns(record) .. me .. '|' .. due_text .. '|' .. id .. ':' .. record
    local token = string.format('%.0f', first + i)
    append(leases, running_key_for(KEYS[3], record_group(record)), lease_until, token)
    runs[2 * i - 1], runs[2 * i] = token, run
    out[#out + 1] = token
    out[#out + 1] = run
    out[#out + 1] = t[3]
    note_keyed(token, run)
  end
  claimed = claimed + n
  for key, members in pairs(zrem) do call_all('ZREM', key, members) end
  call_all('HDEL', KEYS[2], ids)
  call_all('DEL', nil, timer_keys)
  for key, entries in pairs(leases) do call_all('ZADD', key, entries) end
  call_all('HSET', KEYS[4], runs)
end

-- The named ids, read in one HMGET and one ZMSCORE per due index: those due within the
-- horizon are claimed, in the order named (each once), up to the limit.
local function claim_named()
  if #ARGV < 9 or claimed >= limit then return end
  local ids, seen = {}, {}
  for i = 9, #ARGV do
    if not seen[ARGV[i]] then
      seen[ARGV[i]] = true
      ids[#ids + 1] = ARGV[i]
    end
  end
  local records = read_all('HMGET', KEYS[2], ids)
  local by_index, scores = {}, {}
  for i, id in ipairs(ids) do
    local record = records[i]
    if record and served[record_group(record)] then
      append(by_index, (due_key_for(KEYS[1], record)), id)
    end
  end
  for index, members in pairs(by_index) do
    local got = read_all('ZMSCORE', index, members)
    for i, id in ipairs(members) do scores[id] = got[i] end
  end
  local takes = {}
  for i, id in ipairs(ids) do
    if claimed + #takes >= limit then break end
    local score = scores[id] and tonumber(scores[id])
    if score and score <= horizon and not (only_declared
        and not only_declared(ARGV[1] .. id .. ':' .. records[i]))
        and not below_floor(id, records[i], score) and not jumps_queue(records[i], score) then
      takes[#takes + 1] = {id, string.format('%.0f', score), 'e', records[i]}
    end
  end
  take_all(takes)
end

local function recover_lapsed(running)
  if claimed >= limit then return end
  local lapsed = redis.call('ZRANGEBYSCORE', running, '-inf', now, 'LIMIT', 0, limit - claimed)
  for _, token in ipairs(lapsed) do
    local run = redis.call('HGET', KEYS[4], token)
    redis.call('ZREM', running, token)
    redis.call('HDEL', KEYS[4], token)
    local reruns, held_by, rest = string.match(run or '', '^(%d+)@?([^|]*)|(.*)$')
    if reruns then
      redis.call('HINCRBY', KEYS[6], 'reruns', 1)
      local record = string.match(rest, '^[^|]*|[^:]*:(.*)$') or ''
      local rerun = start((tonumber(reruns) + 1) .. me .. '|' .. rest, 'r@' .. held_by,
        record_group(record))
      -- the rerun keeps the key slot the cut run held: it goes before the key's next
      local passed, took_back = transfer_slot(ARGV[1], token, rerun, lease_until)
      if took_back then redis.call('HINCRBY', KEYS[6], 'reruns', 1) end
      if not passed then
        release_slot(ARGV[1], token, now)
      end
    else
      release_slot(ARGV[1], token, now)
      if run then
        redis.log(redis.LOG_WARNING, 'timers: unreadable run record dropped: ' .. token)
      end
    end
  end
end

-- Claim from one due index the timers due in (low, high], earliest first.
local function claim_due(index, low, high)
  if claimed >= limit then return end
  local due = redis.call('ZRANGEBYSCORE', index, low, high, 'WITHSCORES',
    'LIMIT', 0, limit - claimed)
  if #due == 0 then return end
  local ids = {}
  for i = 1, #due, 2 do ids[#ids + 1] = due[i] end
  local records = read_all('HMGET', KEYS[2], ids)
  local takes, stale = {}, {}
  for i, id in ipairs(ids) do
    if records[i] then
      if (not only_declared or only_declared(ARGV[1] .. id .. ':' .. records[i]))
          and not below_floor(id, records[i], due[2 * i]) then
        takes[#takes + 1] = {id, due[2 * i], 's', records[i]}
      end
    else
      stale[#stale + 1] = id  -- no record
    end
  end
  take_all(takes, index, stale)
end

-- declare {
-- A claimed timer's expiring key is named by a window of its due index, which moves
-- between two calls (other listeners claim, more timers come due): so this call claims
-- only the timers whose key it was given. For the named ids it asks only when it was
-- given none of their keys (else it would ask on every call: the sweep below takes the
-- others in their turn). For a due index it reads the timers its body may take from it
-- (the first 2 x limit due by the horizon: claim_due reads no further) and, when one of
-- their keys was not given, asks for the keys of its window: twice as many, due up to
-- DECLARE_SLACK_MS later, and DECLARE_WINDOW more. A listener passes with each claim the
-- keys its last claims asked for (finding/claimer.py KnownKeys): a claim whose due
-- timers' keys it was given reads no further and is one call; one whose due index's
-- head moved on past them asks again, rather than leave due timers behind later ones.
local named_found, named_missing = false, {}
local function need_started(record)  -- a run started: its running set, its order barrier
  need(running_key_for(KEYS[3], record_group(record)))
  if (any_keyed and keyed[record_task(record)]) or record_option(record, 'k') then
    need(flow_key(ARGV[1], 'ungated', barrier_of(record)))
  end
end
for i = 9, #ARGV do
  local record = redis.call('HGET', KEYS[2], ARGV[i])
  if record and served[record_group(record)] then
    need((due_key_for(KEYS[1], record)))
    need_started(record)
    local key = ARGV[1] .. ARGV[i] .. ':' .. record
    if is_declared(key) then named_found = true else named_missing[#named_missing + 1] = key end
  end
end
if not named_found then
  for _, key in ipairs(named_missing) do need(key) end
end
-- (more than the limit, a little later: DECLARE_SLACK_MS, DECLARE_WINDOW)
local lapsed_by = string.format('%.0f', now + DECLARE_SLACK_MS)
local due_by = string.format('%.0f', horizon + DECLARE_SLACK_MS)
for group in pairs(served) do  -- lapsed runs: run again, their slots passed on
  local running = running_key_for(KEYS[3], group)
  if need(running) then
    for _, token in ipairs(redis.call('ZRANGEBYSCORE', running, '-inf', lapsed_by, 'LIMIT',
        0, 2 * limit + DECLARE_WINDOW)) do
      local record = select(5, run_read(redis.call('HGET', KEYS[4], token)))
      if record then need_started(record) end
      need_release(ARGV[1], token)
      need_taken_back(ARGV[1], token)
    end
  end
end
local horizon_by = string.format('%.0f', horizon)
for _, index in ipairs(served_due_indexes(KEYS[1], ARGV[1], served)) do
  if need(index[1]) then
    local records, short = {}, false
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', index[1], '-inf', horizon_by, 'LIMIT', 0,
        2 * limit)) do
      local record = redis.call('HGET', KEYS[2], id)
      if record then
        records[id] = record
        need((due_key_for(KEYS[1], record)))
        need_started(record)
        if not is_declared(ARGV[1] .. id .. ':' .. record) then short = true end
      end
    end
    if short then
      for _, id in ipairs(redis.call('ZRANGEBYSCORE', index[1], '-inf', due_by, 'LIMIT', 0,
          2 * limit + DECLARE_WINDOW)) do
        local record = records[id] or redis.call('HGET', KEYS[2], id)
        if record then
          need_started(record)
          need(ARGV[1] .. id .. ':' .. record)
        end
      end
    end
  end
end
only_declared = is_declared
local asked = keys_asked()
if asked then return asked end
-- declare }
if floor and floor > 0 then  -- a timer moving in (inert until settled) goes before later ones
  for _, arrival in ipairs(redis.call('HVALS', KEYS[7])) do
    local due = tonumber(string.match(arrival, '^(%d+)|'))
    if due and due < floor then floor = due end
  end
end
claim_named()
for group in pairs(served) do recover_lapsed(running_key_for(KEYS[3], group)) end
local indexes = served_due_indexes(KEYS[1], ARGV[1], served)
local now_text, horizon_text = string.format('%.0f', now), string.format('%.0f', horizon)
if #indexes == 1 then  -- one due index: one range, as before there were groups
  claim_due(indexes[1][1], '-inf', horizon_text)
else
  for _, index in ipairs(indexes) do claim_due(index[1], '-inf', now_text) end
  for _, index in ipairs(indexes) do claim_due(index[1], '(' .. now_text, horizon_text) end
end

local next_due, next_lease
for _, index in ipairs(indexes) do
  local head = head_due(index[1])
  if head and (not next_due or head < next_due) then next_due = head end
  if not head and index[3] then redis.call('SREM', sys_key(ARGV[1], 'queues'), index[3]) end
end
for group in pairs(served) do
  local head = head_due(running_key_for(KEYS[3], group))
  if head and (not next_lease or head < next_lease) then next_lease = head end
end
out[2] = next_due or -1
out[3] = next_lease or -1
return out
