-- flow.lua: flow-control helpers shared by every script (put after prelude.lua): the
-- queues where timers held back by a concurrency key or a rate limit wait, and what
-- lets the head of a queue go again. timers/keys.py names the same keys:
--
--   P|slots|<key>  zset  run token (or "w:<id>", a slot kept for a promoted timer) ->
--                        lease deadline ms: the runs holding a slot of concurrency key
--   P|waitk|<key>  zset  id -> queue score: timers waiting for a slot of <key>
--   P|rate|<name>  hash  tat: the theoretical arrival time of rate limit <name> (GCRA);
--                        pacer: the id of the one waiting timer that holds the next slot
--   P|waitr|<name> zset  id -> queue score: timers waiting for rate limit <name>
--   P|parked       hash  id -> "<state>|a|b|c|<name>" of a timer held back by a gate:
--                        c|limit|lease|paid|key   waiting for a slot of key
--                        C|limit|lease|paid|key   promoted, a slot kept for it ("w:<id>")
--                        r|interval|burst|0|name  waiting for rate limit name
--                        R|interval|burst|at|name promoted, the rate slot at `at` its own
--                        (paid 1: it has had its rate slot already)
--   P|held         hash  run token -> "limit|lease|key": the slot a run holds
--
-- A waiting timer keeps its record in the records hash (cancel, get and reschedule find
-- it there) but sits in no due index: nothing polls it. Its queue score orders by
-- priority, then due time: (1000 - priority) * 2^42 + due ms. A timer promoted from a
-- queue goes back into its due index (with ";w=<due it had>" in its record, so its
-- lateness counts the wait) and through the gate again, where its kept slot lets it go:
-- a key's at score 0 (claimed before any backlog of due timers), a rate's at its slot.

local FLOW_DUE_SPAN = 4398046511104  -- 2^42 ms: due times up to the year 2109

local function ms_text(n)
  return string.format('%.0f', n)
end

-- Who takes a promoted timer straight away as a run of its own, or nil (everyone but
-- finish.lua, whose listener has just freed the slot: no wake, no claim, no race for it):
-- {budget = runs it may still take, served = {group = true}, lease_until = ms text,
--  start = function(run, group) -> token, held_ms = the waits of those it took}.
local taker = nil

local function flow_score(record, due)
  return (1000 - record_priority(record)) * FLOW_DUE_SPAN + due
end

local function parked_read(value)
  local state, a, b, c, name =
    string.match(value or '', '^([cCrR])|(%d+)|(%d+)|(%d+)|(.+)$')
  if not state then return nil end
  return {state = state, a = tonumber(a), b = tonumber(b), c = tonumber(c), name = name}
end

local function parked_write(key_start, id, p)
  redis.call('HSET', sys_key(key_start, 'parked'), id, table.concat(
    {p.state, ms_text(p.a), ms_text(p.b), ms_text(p.c), p.name}, '|'))
end

-- `record` with ";w=<due>" (the due time it had before a gate held it), kept if set.
local function with_waited_from(record, due)
  if record_option(record, 'w') then return record end
  local head, rest = string.match(record, '^([^:]*)(:.*)$')
  return head .. ';w=' .. ms_text(due) .. rest
end

-- The head of a waiting queue, taken out of it: its id, parked state and record (nil
-- when the queue is empty; the state or record nil when it was cancelled meanwhile).
local function pop_waiting(key_start, queue)
  local head = redis.call('ZPOPMIN', queue)
  local id = head[1]
  if not id then return nil end
  return id, parked_read(redis.call('HGET', sys_key(key_start, 'parked'), id)),
    redis.call('HGET', sys_key(key_start, 'rec'), id)
end

-- Promote waiting timers of concurrency key `key` while it has free slots: each goes
-- back into its due index at score 0, ahead of every timer due (its lateness counts from
-- its ";w=" due), with a slot kept for it under "w:<id>" for its lease; or, when a taker
-- can, straight into a run of the taker's, holding the slot. Lapsed holders (a dead
-- listener's runs) free their slots here.
local function promote_key(key_start, key, limit, now)
  local slots = sys_key(key_start, 'slots|' .. key)
  local queue = sys_key(key_start, 'waitk|' .. key)
  local records = sys_key(key_start, 'rec')
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
  while redis.call('ZCARD', slots) < limit do
    local id, p, record = pop_waiting(key_start, queue)
    if not id then return end
    if p and p.state == 'c' and record then
      p.state = 'C'
      local group = record_group(record)
      if taker and taker.budget > 0 and taker.served[group] then
        taker.budget = taker.budget - 1
        -- it starts holding the slot: only a paid rate slot is left to remember
        if p.c == 1 then parked_write(key_start, id, p) else
          redis.call('HDEL', sys_key(key_start, 'parked'), id)
        end
        redis.call('HDEL', records, id)
        local waited_from = tonumber(record_option(record, 'w') or '')
        if waited_from then taker.held_ms = taker.held_ms + math.max(now - waited_from, 0) end
        local token = taker.start('|0|' .. id .. ':' .. record, group)
        redis.call('ZADD', slots, taker.lease_until, token)
        redis.call('HSET', sys_key(key_start, 'held'), token,
          ms_text(limit) .. '|' .. ms_text(p.b) .. '|' .. key)
      else
        parked_write(key_start, id, p)
        redis.call('ZADD', slots, ms_text(now + p.b), 'w:' .. id)
        pend(sys_key(key_start, 'due'), records, key_start, id, record, 0, now)
      end
    end
  end
end

-- Give the next slot of rate limit `name` to the head of its queue, unless a waiting
-- timer holds it already (the pacer): the head goes back into its due index at that
-- slot's time, and the limit's tat moves one interval on.
local function promote_rate(key_start, name, interval, burst, now)
  local state = sys_key(key_start, 'rate|' .. name)
  if redis.call('HEXISTS', state, 'pacer') == 1 then return end
  local queue = sys_key(key_start, 'waitr|' .. name)
  local records = sys_key(key_start, 'rec')
  while true do
    local id, p, record = pop_waiting(key_start, queue)
    if not id then return end
    if p and p.state == 'r' and record then
      local tat = math.max(tonumber(redis.call('HGET', state, 'tat') or '0') or 0, now)
      local at = math.max(tat - (burst - 1) * interval, now)
      local next_tat = math.max(tat, at) + interval
      redis.call('HSET', state, 'tat', ms_text(next_tat), 'pacer', id)
      redis.call('PEXPIREAT', state, ms_text(next_tat + 60000))
      p.state, p.c = 'R', at
      parked_write(key_start, id, p)
      pend(sys_key(key_start, 'due'), records, key_start, id, record, at, now)
      return
    end
  end
end

-- Free the slot a run holds (finished, or its lease lapsed) and promote waiting timers.
local function release_slot(key_start, token, now)
  local held_key = sys_key(key_start, 'held')
  local held = redis.call('HGET', held_key, token)
  if not held then return end
  redis.call('HDEL', held_key, token)
  local limit, key = string.match(held, '^(%d+)|%d+|(.+)$')
  if not limit then return end
  redis.call('ZREM', sys_key(key_start, 'slots|' .. key), token)
  promote_key(key_start, key, tonumber(limit), now)
end

-- A handed-back run's timer `id` keeps the concurrency key slot its run `token` held
-- (the run's task may still be going in a process about to exit): the slot is kept for
-- the timer ("w:<id>", as for a promoted one) until `until_ms` + the slot's lease, and
-- nothing else of the key starts meanwhile. Whether the run held a slot still.
local function keep_slot_for(key_start, token, id, until_ms)
  local held_key = sys_key(key_start, 'held')
  local limit, lease, key =
    string.match(redis.call('HGET', held_key, token) or '', '^(%d+)|(%d+)|(.+)$')
  local slots = limit and sys_key(key_start, 'slots|' .. key)
  if not limit or not redis.call('ZSCORE', slots, token) then return false end
  redis.call('HDEL', held_key, token)
  redis.call('ZREM', slots, token)
  redis.call('ZADD', slots, ms_text(until_ms + tonumber(lease)), 'w:' .. id)
  parked_write(key_start, id, {state = 'C', a = tonumber(limit), b = tonumber(lease), c = 0,
                               name = key})
  return true
end

-- Take a pending timer out of whatever flow queue holds it (it is cancelled, replaced or
-- rescheduled): a slot or rate slot kept for it goes to the next in line.
local function unpark(key_start, id)
  local parked = sys_key(key_start, 'parked')
  local p = parked_read(redis.call('HGET', parked, id))
  if not p then return end
  redis.call('HDEL', parked, id)
  local now = redis_now()
  if p.state == 'c' then
    redis.call('ZREM', sys_key(key_start, 'waitk|' .. p.name), id)
  elseif p.state == 'C' then
    if redis.call('ZREM', sys_key(key_start, 'slots|' .. p.name), 'w:' .. id) == 1 then
      promote_key(key_start, p.name, p.a, now)
    end
  elseif p.state == 'r' then
    redis.call('ZREM', sys_key(key_start, 'waitr|' .. p.name), id)
  else
    local state = sys_key(key_start, 'rate|' .. p.name)
    if redis.call('HGET', state, 'pacer') == id then
      redis.call('HDEL', state, 'pacer')
      promote_rate(key_start, p.name, p.a, p.b, now)
    end
  end
end

-- `record` without its ";w=" option (a rescheduled timer starts its lateness afresh).
local function without_waited_from(record)
  local head, rest = string.match(record, '^([^:]*)(:.*)$')
  return (string.gsub(head, ';w=[^;]*', '')) .. rest
end
