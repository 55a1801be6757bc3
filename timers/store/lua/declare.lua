-- declare.lua: the keys a script needs and was not given (Redis Cluster; put after
-- flow.lua and history.lua). On Redis Cluster only KEYS are checked before a script
-- runs: a key it touches without declaring it, while a slot migration has moved it,
-- fails the script part-way (its writes before stay) or is written anew on the old node
-- (MIGRATE then refuses the slot: BUSYKEY). Some keys are named by data only the script
-- reads (a timer's expiring key by its stored record, a group's due index and running
-- set, a concurrency key's or a rate's structures by a held slot, a parked timer, a
-- record), so its caller cannot list them.
--
-- So a script's declare part ("-- declare {" to "-- declare }", kept only where keys
-- are checked: timers/store/scripts.py declares_keys) works out, before its first write
-- and reading only keys it was given, every key its body may touch (a superset: every
-- path its body may take, cascades included), with need(); keys_asked() then replies
-- {{'timers:keys'}, key, ...} when any is missing, and the caller calls it again with
-- them (timers/store/declare.py). A key the part must read to find more (a key's queue,
-- to name the records it holds) is read only once declared: it asks level by level.
-- The need_* helpers below mirror the flow helpers of flow.lua, one each.

-- A declare part that reads a window of time (the timers due by now, the runs lapsed by
-- now) asks for twice as many as the body may take, due up to this much later: the next
-- call, a round trip later, finds a few more due, and must not ask again for them.
local DECLARE_SLACK_MS = 1000
-- ... and this many more (a claim's window: other listeners claim from it meanwhile).
local DECLARE_WINDOW = 100

local declared_keys = nil
local asked_list = nil
local asked_set = nil

-- Whether `key` is one of KEYS.
local function is_declared(key)
  if declared_keys == nil then
    declared_keys = {}
    for i = 1, #KEYS do declared_keys[KEYS[i]] = true end
  end
  return declared_keys[key] == true
end

-- Whether `key` is one of KEYS; when not, it is noted to be asked for (and the script
-- must not read it).
local function need(key)
  if is_declared(key) then return true end
  if asked_set == nil then asked_set, asked_list = {}, {} end
  if not asked_set[key] then
    asked_set[key] = true
    asked_list[#asked_list + 1] = key
  end
  return false
end

-- The reply asking to be called again with the keys noted by need(), or nil when none
-- is missing. No other reply of a script starts with an array.
local function keys_asked()
  if asked_list == nil then return nil end
  local out = {{'timers:keys'}}
  for i = 1, #asked_list do out[i + 1] = asked_list[i] end
  return out
end

-- The keys a timer pended or withdrawn with `record` touches: its expiring key and its
-- due index (prelude.lua pend, withdraw).
local function need_timer(key_start, id, record)
  need(key_start .. id .. ':' .. record)
  need((due_key_for(sys_key(key_start, 'due'), record)))
end

-- The running set of run `token`'s group (named by its run record); its record or nil.
local function need_run(key_start, token)
  local runs = sys_key(key_start, 'runrec')
  if not need(runs) then return nil end
  local record = select(5, run_read(redis.call('HGET', runs, token)))
  if record then need(running_key_for(sys_key(key_start, 'run'), record_group(record))) end
  return record
end

-- The order barrier of a timer with `record` (flow.lua barred): its barrier's index and
-- the running sets of the runs noted in it.
local function need_barrier(key_start, record)
  local index = flow_key(key_start, 'ungated', barrier_of(record))
  local tokens = sys_key(key_start, 'ungatedt')
  if not (need(index) and need(tokens)) then return end
  for _, id in ipairs(redis.call('ZRANGE', index, 0, -1)) do
    local token = redis.call('HGET', tokens, id)
    if token and string.sub(token, 1, 2) == 'p|' then  -- handed back: where it is pending
      local records = sys_key(key_start, 'rec')
      local pending = need(records) and redis.call('HGET', records, id)
      if pending then need((due_key_for(sys_key(key_start, 'due'), pending))) end
    elseif token and string.sub(token, 1, 2) ~= 'r|' then
      need_run(key_start, token)
    end
  end
end

-- A timer with `record` that a promotion may pend (its keys), start as a run of a taker
-- (its group's running set) or check against its order barrier.
local function need_promoted(key_start, id, record)
  need_timer(key_start, id, record)
  need(running_key_for(sys_key(key_start, 'run'), record_group(record)))
  need_barrier(key_start, record)
end

-- The first `n` timers waiting in `queue` in state `state` (flow.lua pop_waiting skips
-- the others), as promoted.
local function need_heads(key_start, queue, state, n)
  local parked, records = sys_key(key_start, 'parked'), sys_key(key_start, 'rec')
  if not (need(queue) and need(parked) and need(records)) then return end
  local from, found = 0, 0
  while found < n do
    local ids = redis.call('ZRANGE', queue, from, from + n - 1)
    for _, id in ipairs(ids) do
      local p = parked_read(redis.call('HGET', parked, id))
      local record = redis.call('HGET', records, id)
      if p and p.state == state and record then
        need_promoted(key_start, id, record)
        found = found + 1
      end
    end
    if #ids < n then return end
    from = from + n
  end
end

-- flow.lua promote_key (and hand_next) for concurrency key `key` of `limit` slots: its
-- slots and queue, and the timers it may promote: at most a slot each, freed and taken
-- again within one call, and a run next in line each. (A run next in line already handed
-- after a holder is read only when that holder's slot is released or passed on:
-- need_release.)
local function need_key(key_start, key, limit)
  need(flow_key(key_start, 'slots', key))
  need_heads(key_start, flow_key(key_start, 'waitk', key), 'c', 4 * (limit or 1) + 4)
end

-- flow.lua promote_rate for rate limit `name`, which may promote `n` timers in a call.
local function need_rate(key_start, name, n)
  need(flow_key(key_start, 'rate', name))
  need_heads(key_start, flow_key(key_start, 'waitr', name), 'r', n)
end

-- flow.lua promote_barred: every key its queue head waits behind the order barrier for.
local function need_barred(key_start)
  local barred_key = sys_key(key_start, 'barred')
  if not need(barred_key) then return end
  local keys = redis.call('HGETALL', barred_key)
  for i = 1, #keys, 2 do need_key(key_start, keys[i], tonumber(keys[i + 1])) end
end

-- flow.lua unpark for timer `id`: the queue that holds it, and what it lets go.
local function need_unpark(key_start, id)
  local parked, tokens = sys_key(key_start, 'parked'), sys_key(key_start, 'ungatedt')
  if not (need(parked) and need(tokens)) then return end
  local note = redis.call('HGET', tokens, id) or ''
  local barrier = string.match(note, '^[rp]|(.+)$')
  if barrier then need(flow_key(key_start, 'ungated', barrier)) end
  local p = parked_read(redis.call('HGET', parked, id))
  if not p then
    if barrier and string.sub(note, 1, 1) == 'p' then need_barred(key_start) end
    return
  end
  if p.state == 'c' or p.state == 'C' then
    need_key(key_start, p.name, p.a)
  else
    need_rate(key_start, p.name, 2)
  end
  need_barred(key_start)
end

-- prelude.lua withdraw of timer `id` (its record read from `records_key`, which the
-- script was given), then unpark: the record, or nil.
local function need_withdraw(key_start, records_key, id)
  local record = redis.call('HGET', records_key, id)
  if not record then return nil end
  need_timer(key_start, id, record)
  need_unpark(key_start, id)
  return record
end

-- A run next in line after `token` that goes back into its key's queue (flow.lua
-- take_back_next), with the record it goes back with (reruns or one more): its running
-- set, and its keys should it be promoted again in the same call.
local function need_taken_back(key_start, token)
  local next_key = sys_key(key_start, 'next')
  if not need(next_key) then return end
  local successor = redis.call('HGET', next_key, token)
  if not successor then return end
  local runs = sys_key(key_start, 'runrec')
  if not need(runs) then return end
  local reruns, _, due, id, record = run_read(redis.call('HGET', runs, successor))
  if not record then return end
  need(running_key_for(sys_key(key_start, 'run'), record_group(record)))
  local waiting = with_waited_from(record, tonumber(due))
  need_promoted(key_start, id, with_reruns(waiting, reruns))
  need_promoted(key_start, id, with_reruns(waiting, tonumber(reruns) + 1))
end

-- flow.lua release_slot, transfer_slot and keep_slot_for of run `token`: the key whose
-- slot it holds, and the run next in line after it.
local function need_release(key_start, token)
  local held = sys_key(key_start, 'held')
  if not need(held) then return end
  local limit, key = string.match(redis.call('HGET', held, token) or '', '^(%d+)|%d+|(.+)$')
  if not limit then return end
  need_taken_back(key_start, token)
  need_key(key_start, key, tonumber(limit))
end
