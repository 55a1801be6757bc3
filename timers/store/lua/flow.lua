-- flow.lua: flow-control helpers shared by every script (put after prelude.lua): the
-- queues where timers held back by a concurrency key or a rate limit wait, and what
-- lets the head of a queue go again. timers/model/keys.py names the same keys:
-- State machine: docs/state-machine.md (transitions T11 to T15, T22).
--
--   P|slots|<key>  zset  run token (or "w:<id>", a slot kept for a promoted timer) ->
--                        lease deadline ms: the runs holding a slot of concurrency key
--   P|waitk|<key>  zset  id -> queue score: timers waiting for a slot of <key>
--   P|rate|<name>  hash  tat: the theoretical arrival time of rate limit <name> (GCRA);
--                        pacer: the id of the one waiting timer that holds the next slot;
--                        last: ms of its last start (gate.lua)
--   P|waitr|<name> zset  id -> queue score: timers waiting for rate limit <name>
--   P|parked       hash  id -> "<state>|a|b|c|<name>" of a timer held back by a gate:
--                        c|limit|lease|paid|key   waiting for a slot of key
--                        C|limit|lease|paid|key   promoted, a slot kept for it ("w:<id>")
--                        r|interval|burst|0|name  waiting for rate limit name
--                        R|interval|burst|at|name promoted, the rate slot at `at` its own
--                        (paid 1: it has had its rate slot already; gate.lua no
--                        longer writes it: a rate slot is paid for only at its time)
--   P|held         hash  run token -> "limit|lease|key": the slot a run holds
--   P|ungated|<b> zset   id -> queue score: timers that a claim gave a listener and whose
--                        gate has not seen them yet, per barrier: "k:<key>" for a timer
--                        with its own key, "t:<task>" for one of a keyed task (the order
--                        barrier, below)
--   P|ungatedt     hash  id -> run token of those (a run gone no longer bars; a lapsed
--                        one does until a claim recovers it),
--                        or "r|<b>" for a keyed timer waiting for its rate limit (r, R),
--                        which keeps its place in its key's order meanwhile
--   P|barred       hash  key -> limit: keys whose queue head waits behind the barrier
--   P|next         hash  run token -> the run next in line on its slot: the key's next
--                        timer, handed to the same listener while the run goes (source
--                        "n@<token>"); it starts as the run ends and takes the slot over
--                        when the run's ending is written (pass_slot), or goes back into
--                        the key's queue when the run's gate holds it (take_back_next)
--
-- A waiting timer keeps its record in the records hash (cancel, get and reschedule find
-- it there) but sits in no due index: nothing polls it. Its queue score orders by
-- priority, then due time: (1000 - priority) * 2^42 + due ms. A timer promoted from a
-- queue goes back into its due index (with ";w=<due it had>" in its record, so its
-- lateness counts the wait) and through the gate again, where its kept slot lets it go:
-- a key's at score 0 (claimed before any backlog of due timers), a rate's at its slot.

local FLOW_DUE_SPAN = 4398046511104  -- 2^42 ms: due times up to the year 2109

-- The order barrier (invariant 13: a key's timers start in (priority, due, scheduling)
-- order at a burst, whichever listener claims them). A keyed task's key is a function of
-- its args that only a listener can work out, so a listener that gates a later timer of a
-- key first (it claimed it in the next claim, or its reply came sooner) would take the
-- key's free slot ahead of an earlier one another listener has claimed but not gated. So
-- each claim notes the keyed timers it gives out (note_ungated), each gate takes its runs
-- off (drop_ungated), and a free slot goes to a timer only when no earlier timer of its
-- barrier (its own key, or its task) is still claimed and ungated (barred): otherwise it waits in its key's queue, in
-- order, and the key is promoted again once the barrier lifts (promote_barred). A claimed
-- run that is gone no longer bars; one whose lease lapsed does until a claim recovers it
-- (its rerun is noted again) or it ends. One handed back before its gate (T17: its
-- listener stops, or lost Redis around the gate) is pending again and still bars ("p|"),
-- while it is pending at its place, until a claim notes it anew or it is withdrawn.
-- Ties in score go by id: generated ids sort in the order they were scheduled.
local function record_task(record)
  return string.match(record, '^[^;:]*')
end

-- The order barrier a timer is noted in: its own key when the producer gave one (";k=",
-- known here: only that key's timers wait for it), else its task (a key the task works
-- out from the args is known to the listener alone: every timer of the task waits).
local function barrier_of(record)
  local key = string.find(record, ';k=', 1, true) and record_option(record, 'k')
  if key and key ~= '' then return 'k:' .. key end
  return 't:' .. record_task(record)
end

local function ms_text(n)
  return string.format('%.0f', n)
end

-- Who takes a promoted timer straight away as a run of its own, or nil (everyone but
-- finish.lua, whose listener has just freed the slot: no wake, no claim, no race for it):
-- {budget = runs it may still take, served = {group = true}, lease_until = ms text,
--  follow = whether it takes runs next in line (hand_next),
--  start = function(run, group, source) -> token, held_ms = the waits of those it took}.
local taker = nil

local function flow_score(record, due)
  return (1000 - record_priority(record)) * FLOW_DUE_SPAN + due
end

local function note_ungated(key_start, id, token, record, due)
  redis.call('ZADD', flow_key(key_start, 'ungated', barrier_of(record)),
    flow_score(record, due), id)
  redis.call('HSET', sys_key(key_start, 'ungatedt'), id, token)
end

local function drop_ungated(key_start, id, record)
  if redis.call('HDEL', sys_key(key_start, 'ungatedt'), id) == 1 then
    redis.call('ZREM', flow_key(key_start, 'ungated', barrier_of(record)), id)
  end
end

local function parked_read(value)
  local state, a, b, c, name =
    string.match(value or '', '^([cCrR])|(%d+)|(%d+)|(%d+)|(.+)$')
  if not state then return nil end
  return {state = state, a = tonumber(a), b = tonumber(b), c = tonumber(c), name = name}
end

-- Whether timer `id` (its record, its queue score) must wait for an earlier timer of its
-- barrier that a listener claimed and has not gated yet. A claimed run bars while Redis
-- still has it (its token in its running set), lapsed or not: a run whose lease lapsed is
-- still its listener's until a claim recovers it (its rerun is noted again, and goes
-- first) or it is ended (its listener may renew it, T19, and gate it); handed back, it
-- bars while it is pending at its place ("p|"). Earlier entries that bar no more are
-- dropped on the way.
local function barred(key_start, id, record, score, now)
  local index = flow_key(key_start, 'ungated', barrier_of(record))
  local tokens = sys_key(key_start, 'ungatedt')
  while true do
    local head = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
    local first, first_score = head[1], tonumber(head[2])
    if not first or first == id or first_score > score
        or (first_score == score and first > id) then
      return false
    end
    local token = redis.call('HGET', tokens, first)
    if token and string.sub(token, 1, 2) == 'p|' then
      -- handed back unclaimed (T17): it bars while it is pending at its place
      local record_now = redis.call('HGET', sys_key(key_start, 'rec'), first)
      local pended = record_now and redis.call('ZSCORE',
        (due_key_for(sys_key(key_start, 'due'), record_now)), first)
      if pended and tonumber(pended) <= math.fmod(first_score, FLOW_DUE_SPAN) then
        return true
      end
      token = nil
    end
    if token and string.sub(token, 1, 2) == 'r|' then token = nil end  -- no run: rate wait
    local run = token and redis.call('HGET', sys_key(key_start, 'runrec'), token)
    local run_record = run and select(5, run_read(run))
    if run_record and redis.call('ZSCORE', running_key_for(
        sys_key(key_start, 'run'), record_group(run_record)), token) then
      return true  -- claimed (leased, or lapsed and not recovered yet)
    end
    -- no run: it still bars while it waits for its rate (r) or paces (R), claimed or
    -- not (a pacer's run handed back is pending again, still the rate's pacer)
    local p = parked_read(redis.call('HGET', sys_key(key_start, 'parked'), first))
    if p and (p.state == 'r' or p.state == 'R') then return true end
    redis.call('ZREM', index, first)
    redis.call('HDEL', tokens, first)
  end
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

-- `record` carrying the reruns of the run it came from (";rc=<n>", for n > 0): a rerun (its
-- listener died holding it) that waits for its key or is handed back is still a rerun when
-- it starts again (counted toward its crash limit, run in quarantine), not a first run.
local function with_reruns(record, reruns)
  local n = tonumber(reruns or '0') or 0
  if n <= 0 and not string.find(record, ';rc=', 1, true) then return record end  -- most
  local head, rest = string.match(record, '^([^:]*)(:.*)$')
  head = string.gsub(head, ';rc=[^;]*', '')
  if n > 0 then head = head .. ';rc=' .. string.format('%d', n) end
  return head .. rest
end

-- The reruns a pending timer's record carries (with_reruns), as run record text.
local function record_reruns(record)
  if not string.find(record, ';rc=', 1, true) then return '0' end
  local n = record_option(record, 'rc')
  return is_count(n) and n or '0'
end

-- The "|due|" part of a run record for a timer taken from a waiting queue: the due time
-- it had before a gate held it (";w="), so the listener that takes it waits for that time
-- if it has not come (a timer claimed ahead of its due time and held back may be handed
-- over before it is due): never started before its due time, keyed or not.
local function due_part(record)
  return '|' .. (record_option(record, 'w') or '0') .. '|'
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

-- The run next in line after `holder` (a run of the taker's that holds a slot of `key`):
-- the key's next waiting timer, handed to the taker as a run that holds no slot yet
-- (source "n@<holder>"). The taker starts it the moment the holder ends (in the same
-- thread), and it takes the holder's slot over when the holder's ending is written. Not
-- when the taker takes none, or the head is of a group it does not serve or has paid a
-- rate slot already (the gate must see that one).
local function hand_next(key_start, key, holder)
  if not (taker and taker.follow) then return end
  local queue = flow_key(key_start, 'waitk', key)
  local parked = sys_key(key_start, 'parked')
  local records = sys_key(key_start, 'rec')
  while true do
    local id = redis.call('ZRANGE', queue, 0, 0)[1]
    if not id then return end
    local p = parked_read(redis.call('HGET', parked, id))
    local record = redis.call('HGET', records, id)
    if p and p.state == 'c' and record then
      local group = record_group(record)
      if p.c == 1 or not taker.served[group] then return end
      local now = redis_now()
      if barred(key_start, id, record, flow_score(record, tonumber(record_option(record, 'w')
          or '') or 0), now) then
        redis.call('HSET', sys_key(key_start, 'barred'), key, ms_text(p.a))
        return
      end
      redis.call('ZREM', queue, id)
      redis.call('HDEL', parked, id)
      redis.call('HDEL', records, id)
      local token = taker.start(due_part(record) .. id .. ':' .. record, group, 'n@' .. holder)
      redis.call('HSET', sys_key(key_start, 'next'), holder, token)
      return
    end
    redis.call('ZREM', queue, id)  -- cancelled meanwhile (as pop_waiting drops it)
  end
end

-- The run next in line after `token` (hand_next), when `token` does not start after all: its
-- gate held it back for its rate limit (T9), and it keeps its place in its key's order. A
-- run next in line follows the run before it only into a start: it goes back into its
-- key's queue, in its place (its queue score, from its ";w=" due), its run dropped, and
-- the slot does not pass to it. Its listener, told the run before it was held, does not
-- start it (executor.py). A lapsed one nobody recovered goes back too: it is still that
-- listener's (the one gating the run before it), which never starts it now, and it keeps
-- its place ahead of the key's later timers. Nothing when it is gone (handed back, or
-- recovered by a claim: its rerun decides) or a newer timer has its id. `cut`: the run
-- before it was recovered (its listener died or stalled past its lease), so this one may
-- have started in that listener's thread as the run before it returned: it goes back as
-- a rerun (reruns + 1: counted, and run in quarantine). Whether it took one back.
local function take_back_next(key_start, token, cut)
  local next_key = sys_key(key_start, 'next')
  local successor = redis.call('HGET', next_key, token)
  if not successor then return false end
  redis.call('HDEL', next_key, token)
  local limit, lease, key = string.match(
    redis.call('HGET', sys_key(key_start, 'held'), token) or '', '^(%d+)|(%d+)|(.+)$')
  local runs = sys_key(key_start, 'runrec')
  local reruns, _, due, id, record = run_read(redis.call('HGET', runs, successor))
  if not (limit and record) then return false end
  local running = running_key_for(sys_key(key_start, 'run'), record_group(record))
  if redis.call('ZREM', running, successor) == 0 then return false end
  redis.call('HDEL', runs, successor)
  local records = sys_key(key_start, 'rec')
  if redis.call('HEXISTS', records, id) == 1 then return false end
  if cut then reruns = tonumber(reruns) + 1 end
  record = with_reruns(with_waited_from(record, tonumber(due)), reruns)
  redis.call('HSET', records, id, record)
  redis.call('ZADD', flow_key(key_start, 'waitk', key),
    flow_score(record, tonumber(record_option(record, 'w'))), id)
  parked_write(key_start, id, {state = 'c', a = tonumber(limit), b = tonumber(lease), c = 0,
                               name = key})
  return true
end

-- Free the slots of `key` whose lease lapsed and that no run holds any more: a slot kept
-- for a promoted timer ("w:<id>") that was not claimed in time, or one whose run record is
-- gone. A run whose lease lapsed still holds its slot (its process may only be paused and
-- still running the task) until a claim recovers the run (claim.lua passes the slot on to
-- the rerun) or its ending is written: at most N runs of a key at once, counting those.
local function free_lapsed_slots(key_start, slots, now)
  local lapsed = redis.call('ZRANGEBYSCORE', slots, '-inf', now)
  if #lapsed == 0 then return end
  local runs = sys_key(key_start, 'runrec')
  for _, member in ipairs(lapsed) do
    if string.sub(member, 1, 2) == 'w:' or redis.call('HEXISTS', runs, member) == 0 then
      redis.call('ZREM', slots, member)
      redis.call('HDEL', sys_key(key_start, 'held'), member)
    end
  end
end

-- The slot `token` holds (a run whose lease lapsed, recovered by a claim) passes to its
-- rerun `rerun`, with the rerun's lease: the rerun goes first, ahead of the key's waiting
-- timers and of a run next in line that was handed along with the old run: that one goes
-- back into the key's queue in its place, as a rerun (take_back_next with `cut`: it may
-- have started in the old run's thread; its listener, which renews it, hears it is lost
-- and does not start it now), else it would follow the old run's end into a start while
-- the rerun holds the slot. Whether there was a slot to pass, and whether a run next in
-- line went back.
local function transfer_slot(key_start, token, rerun, lease_until)
  local held_key = sys_key(key_start, 'held')
  local held = redis.call('HGET', held_key, token)
  if not held then return false, false end
  local took = take_back_next(key_start, token, true)  -- it waits again, behind the rerun
  redis.call('HDEL', held_key, token)
  local key = string.match(held, '^%d+|%d+|(.+)$')
  if not key then return false, took end
  local slots = flow_key(key_start, 'slots', key)
  if redis.call('ZREM', slots, token) == 0 then return false, took end
  redis.call('ZADD', slots, lease_until, rerun)
  redis.call('HSET', held_key, rerun, held)
  return true, took
end

-- Promote waiting timers of concurrency key `key` while it has free slots: each goes
-- back into its due index at score 0, ahead of every timer due (its lateness counts from
-- its ";w=" due), with a slot kept for it under "w:<id>" for its lease; or, when a taker
-- can, straight into a run of the taker's, holding the slot. Lapsed holders (a dead
-- listener's runs) free their slots here.
local function promote_key(key_start, key, limit, now)
  local slots = flow_key(key_start, 'slots', key)
  local queue = flow_key(key_start, 'waitk', key)
  local records = sys_key(key_start, 'rec')
  free_lapsed_slots(key_start, slots, now)
  while redis.call('ZCARD', slots) < limit do
    local head = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')
    if head[1] then
      local record = redis.call('HGET', records, head[1])
      if record and barred(key_start, head[1], record, tonumber(head[2]), now) then
        redis.call('HSET', sys_key(key_start, 'barred'), key, ms_text(limit))
        return
      end
    end
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
        local token = taker.start(due_part(record) .. id .. ':' .. record, group, 'h')
        redis.call('ZADD', slots, taker.lease_until, token)
        redis.call('HSET', sys_key(key_start, 'held'), token,
          ms_text(limit) .. '|' .. ms_text(p.b) .. '|' .. key)
        hand_next(key_start, key, token)
      else
        parked_write(key_start, id, p)
        redis.call('ZADD', slots, ms_text(now + p.b), 'w:' .. id)
        pend(sys_key(key_start, 'due'), records, key_start, id, record, 0, now)
      end
    end
  end
end

-- The Redis clock time by which this server had surely started (INFO's uptime counts
-- whole seconds, so a second is added), or nil where INFO is refused (an ACL without it)
-- or unknown (fakeredis): read once per script call.
local started_by = false
local function server_started_by(now)
  if started_by == false then
    local ok, info = pcall(redis.call, 'INFO', 'server')
    local up = ok and type(info) == 'string'
      and tonumber(string.match(info, 'uptime_in_seconds:(%d+)'))
    started_by = up and (now - up * 1000 + 1000) or nil
  end
  return started_by
end

-- The tat of rate limit `state` (its hash) as a start now must read it: at least `now`,
-- and at least what a whole burst spent the moment this server started would leave. A
-- server killed (kill -9, a crash) loses its last second of writes with appendfsync
-- everysec (more with persistence off), the tat its last starts wrote among them; those
-- starts came before it went down, so before it started again: no start of the rate
-- comes within an interval of the server's start (the cost: a rate unused across a
-- restart waits up to an interval, plus a second, after it).
local function rate_tat(state, interval, burst, now)
  local tat = math.max(tonumber(redis.call('HGET', state, 'tat') or '0') or 0, now)
  local started = server_started_by(now)
  if started then tat = math.max(tat, started + burst * interval) end
  return tat
end

-- Rate limit `state` (its hash) is kept for as long as it has a pacer, which may wait for
-- its slot any time (listeners away or busy): with the pacer forgotten, a second pacer
-- and a start beside them would be let go. Without one it expires a minute after its tat,
-- when reading it or its absence comes to the same (rate_tat).
local function rate_keep(state)
  if redis.call('HEXISTS', state, 'pacer') == 1 then
    redis.call('PERSIST', state)
  else
    local tat = tonumber(redis.call('HGET', state, 'tat') or '0') or 0
    redis.call('PEXPIREAT', state, ms_text(tat + 60000))
  end
end

-- Give the next slot of rate limit `name` to the head of its queue, unless a waiting
-- timer holds it already (the pacer): the head goes back into its due index at that
-- slot's time, and the limit's tat moves one interval on.
local function promote_rate(key_start, name, interval, burst, now)
  local state = flow_key(key_start, 'rate', name)
  if redis.call('HEXISTS', state, 'pacer') == 1 then return end
  local queue = flow_key(key_start, 'waitr', name)
  local records = sys_key(key_start, 'rec')
  while true do
    local id, p, record = pop_waiting(key_start, queue)
    if not id then return end
    if p and p.state == 'r' and record then
      local tat = rate_tat(state, interval, burst, now)
      local at = math.max(tat - (burst - 1) * interval, now)
      local next_tat = math.max(tat, at) + interval
      redis.call('HSET', state, 'tat', ms_text(next_tat), 'pacer', id)
      redis.call('PERSIST', state)  -- rate_keep
      p.state, p.c = 'R', at
      parked_write(key_start, id, p)
      pend(sys_key(key_start, 'due'), records, key_start, id, record, at, now)
      return
    end
  end
end

-- The run next in line after `token` (hand_next) takes over the slot `token` held
-- (`held`: its "limit|lease|key"), for as long as its own lease, unless it is gone (handed
-- back, recovered); and the taker may get the one after it. A run next in line whose
-- lease lapsed takes it too: it is still its listener's (which may renew it, T19, and go
-- on) until a claim recovers it, and then the slot passes to its rerun (transfer_slot).
local function pass_slot(key_start, token, held, key, now)
  local next_key = sys_key(key_start, 'next')
  local successor = redis.call('HGET', next_key, token)
  if not successor then return end
  redis.call('HDEL', next_key, token)
  local record = select(5, run_read(redis.call('HGET', sys_key(key_start, 'runrec'), successor)))
  local until_ms = record and redis.call('ZSCORE',
    running_key_for(sys_key(key_start, 'run'), record_group(record)), successor)
  if not until_ms then return end
  redis.call('ZADD', flow_key(key_start, 'slots', key), until_ms, successor)
  redis.call('HSET', sys_key(key_start, 'held'), successor, held)
  local waited_from = tonumber(record_option(record, 'w') or '')
  if waited_from and taker then
    taker.held_ms = taker.held_ms + math.max(now - waited_from, 0)
  end
  hand_next(key_start, key, successor)
end

-- Free the slot a run holds (finished, or its lease lapsed): to the run next in line
-- after it, if any, else to waiting timers.
local function release_slot(key_start, token, now)
  local held_key = sys_key(key_start, 'held')
  local held = redis.call('HGET', held_key, token)
  if not held then return end
  redis.call('HDEL', held_key, token)
  local limit, key = string.match(held, '^(%d+)|%d+|(.+)$')
  if not limit then return end
  redis.call('ZREM', flow_key(key_start, 'slots', key), token)
  pass_slot(key_start, token, held, key, now)
  promote_key(key_start, key, tonumber(limit), now)
end

-- Promote the keys whose queue head waited behind the order barrier (barred), now that
-- a gate or an ending may have lifted it (a key still barred is noted again).
local function promote_barred(key_start, now)
  local barred_key = sys_key(key_start, 'barred')
  if redis.call('EXISTS', barred_key) == 0 then return end  -- most calls
  local keys = redis.call('HGETALL', barred_key)
  redis.call('DEL', barred_key)
  for i = 1, #keys, 2 do promote_key(key_start, keys[i], tonumber(keys[i + 1]), now) end
end

-- A handed-back run's timer `id` keeps the concurrency key slot its run `token` held
-- (it was handed over holding it and did not start, or its task may still be going in a
-- process about to exit): the slot is kept for the timer ("w:<id>", as for a promoted
-- one) until `until_ms` + the slot's lease, and nothing else of the key starts meanwhile;
-- its run next in line goes back into the key's queue in its place (T22). Whether the
-- run held a slot still.
local function keep_slot_for(key_start, token, id, until_ms)
  local held_key = sys_key(key_start, 'held')
  local limit, lease, key =
    string.match(redis.call('HGET', held_key, token) or '', '^(%d+)|(%d+)|(.+)$')
  local slots = limit and flow_key(key_start, 'slots', key)
  if not limit or not redis.call('ZSCORE', slots, token) then return false end
  take_back_next(key_start, token, false)  -- its run next in line waits in its place
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
  local tokens = sys_key(key_start, 'ungatedt')
  local note = redis.call('HGET', tokens, id) or ''
  local barrier = string.match(note, '^[rp]|(.+)$')
  if barrier then  -- it no longer holds its key's order (waiting for its rate, handed back)
    redis.call('HDEL', tokens, id)
    redis.call('ZREM', flow_key(key_start, 'ungated', barrier), id)
  end
  local p = parked_read(redis.call('HGET', parked, id))
  if not p then
    if barrier and string.sub(note, 1, 1) == 'p' then promote_barred(key_start, redis_now()) end
    return
  end
  redis.call('HDEL', parked, id)
  local now = redis_now()
  if p.state == 'c' then
    redis.call('ZREM', flow_key(key_start, 'waitk', p.name), id)
  elseif p.state == 'C' then
    if redis.call('ZREM', flow_key(key_start, 'slots', p.name), 'w:' .. id) == 1 then
      promote_key(key_start, p.name, p.a, now)
    end
  elseif p.state == 'r' then
    redis.call('ZREM', flow_key(key_start, 'waitr', p.name), id)
    promote_barred(key_start, now)  -- the keyed timers it held back in its key's order
  else
    local state = flow_key(key_start, 'rate', p.name)
    if redis.call('HGET', state, 'pacer') == id then
      redis.call('HDEL', state, 'pacer')
      rate_keep(state)
      promote_rate(key_start, p.name, p.a, p.b, now)
    end
    promote_barred(key_start, now)
  end
end

-- `record` without its ";w=" option (a rescheduled timer starts its lateness afresh).
local function without_waited_from(record)
  local head, rest = string.match(record, '^([^:]*)(:.*)$')
  return (string.gsub(head, ';w=[^;]*', '')) .. rest
end
