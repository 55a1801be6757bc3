#!lua
-- gate.lua: let claimed runs start, or hold them back for a concurrency key or a rate
-- limit (flow.lua has the keys and the queue states).
-- State machine: docs/state-machine.md (transitions T7 to T10, T22, T23, T29).
--
-- KEYS[1]  running: the plain running zset (a group's is "<it>|<group>")
-- KEYS[2]  running records: hash, run token -> "reruns@<listener>|due|<id>:<record>"
-- KEYS[3]  records: hash, escaped id -> record
-- KEYS[4]  stats: hash of counters
-- KEYS[5..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  lease ms of a slot (renewed with the run's lease)
-- ARGV[4..] six values per run: token, concurrency key ("" for none), its limit, rate
--          limit name ("" for none), its interval ms, its burst
--
-- A run goes when its key has a free slot (or one kept for it) and nobody waits ahead of
-- it (in the key's queue, or claimed earlier and not gated yet: flow.lua's order barrier), and its rate limit has a slot now (GCRA: tat - now <= (burst - 1) * interval) and
-- nobody waits for it; it then holds the slot until it ends (finish.lua frees it) or its
-- lease lapses. Otherwise it is no longer run: its timer waits in the key's or the
-- limit's queue, by priority then due time, uncounted as an attempt, and goes back into
-- its due index when a slot frees (key) or when its slot time comes (rate). A run whose
-- lease is gone changes nothing; one whose id was scheduled again meanwhile is dropped
-- (the newer timer wins), as a retry would be.
-- No allow-oom flag: holding a timer back writes. Every value is checked first.
-- A run that goes after waiting adds its wait (now - its ";w=" due) to the held_ms counter.
-- Returns one status per run: "go", "wait" (held back), "lost" (lease gone) or
-- "replaced".
if not is_count(ARGV[3]) or (#ARGV - 3) % 6 ~= 0 then
  return redis.error_reply('ERR timers gate: bad arguments')
end
for i = 4, #ARGV, 6 do
  local limited, rated = ARGV[i + 1] ~= '', ARGV[i + 3] ~= ''
  if ARGV[i] == '' or (limited and not string.match(ARGV[i + 2], '^[1-9]%d*$'))
      or (rated and not (string.match(ARGV[i + 4], '^[1-9]%d*$')
                         and string.match(ARGV[i + 5], '^[1-9]%d*$'))) then
    return redis.error_reply('ERR timers gate: bad run ' .. ((i - 4) / 6 + 1))
  end
end

local now = redis_now()
local lease = tonumber(ARGV[3])
local RATE_JITTER_MS = 5  -- how much closer than its interval a rate's starts may come
local parked_key = sys_key(ARGV[1], 'parked')
local counts = {waited = 0, rate_limited = 0, held_ms = 0}

-- Hold the run back: no longer running, its timer pending again in `queue`.
local function hold(token, id, record, due, queue, p, rk, reruns)
  redis.call('ZREM', rk, token)
  redis.call('HDEL', KEYS[2], token)
  if redis.call('HEXISTS', KEYS[3], id) == 1 then return 'replaced' end
  record = with_reruns(with_waited_from(record, due), reruns)
  redis.call('HSET', KEYS[3], id, record)
  redis.call('ZADD', queue, flow_score(record, tonumber(record_option(record, 'w'))), id)
  parked_write(ARGV[1], id, p)
  return 'wait'
end

-- A pacer gated before its own rate slot (its listener's estimate of the Redis clock ran
-- ahead of Redis): not paid yet, so its start cannot come closer than an interval (less
-- RATE_JITTER_MS) to the start that gave it the slot. Its run is dropped; it stays the
-- rate's pacer (its parked R entry, the rate's `pacer`, its place in its key's order
-- barrier), pending again at its slot (T23).
local function too_early(token, id, record, due, slot, rk, reruns)
  redis.call('ZREM', rk, token)
  redis.call('HDEL', KEYS[2], token)
  if redis.call('HEXISTS', KEYS[3], id) == 1 then return 'replaced' end
  local tokens = sys_key(ARGV[1], 'ungatedt')
  if redis.call('HGET', tokens, id) == token then  -- noted by its claim: a rate wait again
    note_ungated(ARGV[1], id, 'r|' .. barrier_of(record), record, due)
  end
  pend(sys_key(ARGV[1], 'due'), KEYS[3], ARGV[1], id, with_reruns(record, reruns), slot, now)
  return 'wait'
end

-- A slot of `key` for the run: one kept for it, or a free one, either only while nobody
-- waits ahead of it (in the key's queue, by queue score and then id, or claimed and not
-- gated yet, or waiting for its rate limit: flow.lua's order barrier). A kept slot whose
-- timer finds one ahead of it (come to wait since it was promoted: a higher priority, a
-- retry due earlier) goes to that one: the run waits in its place (gate then promotes
-- the key).
local function take_slot(token, id, record, due, key, limit, kept)
  local slots = flow_key(ARGV[1], 'slots', key)
  if redis.call('ZSCORE', slots, token) then return true end  -- handed over with it
  local score = flow_score(record, due)
  local head = redis.call('ZRANGE', flow_key(ARGV[1], 'waitk', key), 0, 0, 'WITHSCORES')
  local head_score = tonumber(head[2])
  local waits_ahead = head[1] ~= nil
    and (head_score < score or (head_score == score and head[1] < id))
  if kept and redis.call('ZREM', slots, 'w:' .. id) == 1 then
    if waits_ahead or barred(ARGV[1], id, record, score, now) then return false end
    redis.call('ZADD', slots, ms_text(now + lease), token)
    return true
  end
  free_lapsed_slots(ARGV[1], slots, now)
  if redis.call('ZCARD', slots) < limit and not waits_ahead then
    if barred(ARGV[1], id, record, score, now) then
      redis.call('HSET', sys_key(ARGV[1], 'barred'), key, ms_text(limit))
      return false
    end
    redis.call('ZADD', slots, ms_text(now + lease), token)
    return true
  end
  return false
end

-- Whether rate limit `name` has a slot now for a run nobody waits ahead of (taken if so).
local function take_rate(name, interval, burst)
  local state = flow_key(ARGV[1], 'rate', name)
  if redis.call('HEXISTS', state, 'pacer') == 1
      or redis.call('EXISTS', flow_key(ARGV[1], 'waitr', name)) == 1 then
    return false
  end
  local tat = rate_tat(state, interval, burst, now)
  if tat - now > (burst - 1) * interval then return false end
  redis.call('HSET', state, 'tat', ms_text(tat + interval))
  redis.call('PEXPIREAT', state, ms_text(tat + interval + 60000))
  return true
end

-- A run a gate call of its own let go that did not start asks again (T29): its listener
-- reached its call past the start window, or its quarantine child found its lease stale.
-- While no start of rate limit `name` was let go since its own (`by` still names it with
-- the rate's `last`, which every gate writes with a start, an older release's too), the
-- rate's slots move on by its lateness: its unused one to now and the slot of the rate's
-- pacer, if a hold made one meanwhile, as far: the starts around it keep their interval,
-- and the rate loses its lateness instead of a slot. Not when it came later than an
-- interval (a slot lost costs less), nor across a server start (T21: the starts let go
-- after its own may be lost).
local function retake_rate(token, name, interval)
  local state = flow_key(ARGV[1], 'rate', name)
  local got = redis.call('HMGET', state, 'tat', 'last', 'by', 'pacer')
  local tat, last = tonumber(got[1]), tonumber(got[2])
  if not tat or not last or got[3] ~= token .. '|' .. got[2] then return false end
  local started = server_started_by(now)
  if started and last < started then return false end
  local later = math.max(now - last, 0)
  if later > interval then return false end
  if got[4] then  -- the rate's pacer: its slot moves on as far (T23 if claimed already)
    local p = parked_read(redis.call('HGET', parked_key, got[4]))
    if not p or p.state ~= 'R' then return false end
    p.c = p.c + later
    parked_write(ARGV[1], got[4], p)
  end
  redis.call('HSET', state, 'tat', ms_text(tat + later))  -- (`last` and `by`: at its go)
  rate_keep(state)
  return true
end

local function gate(token, key, limit, rate, interval, burst)
  local reruns, _, due, id, record = run_read(redis.call('HGET', KEYS[2], token))
  local rk = record and running_key_for(KEYS[1], record_group(record))
  if not record or not redis.call('ZSCORE', rk, token) then return 'lost' end
  due = tonumber(record_option(record, 'w') or due) or tonumber(due)
  local p = parked_read(redis.call('HGET', parked_key, id)) or {state = ''}
  if p.state == 'R' and now < p.c then  -- a pacer come before its slot: not paid yet
    return too_early(token, id, record, due, p.c, rk, reruns)
  end
  drop_ungated(ARGV[1], id, record)
  redis.call('HDEL', parked_key, id)
  local paid, slot_lost = false, false
  if p.state == 'R' then
    -- only the rate's one pacer is paid (its slot came after the rate's last start); a
    -- slot due before this server started may have been taken already, by this very
    -- timer, in writes a kill of the server lost. A run not paid asks the rate again.
    local state = flow_key(ARGV[1], 'rate', p.name)
    if redis.call('HGET', state, 'pacer') == id then
      redis.call('HDEL', state, 'pacer')
      local started = server_started_by(now)
      paid = started == nil or p.c >= started
      slot_lost = not paid
    end
    if paid then
      -- the next slot is an interval after this start, give or take RATE_JITTER_MS: a
      -- start late by more than that (a restart, a stalled listener) pushes the next slot
      -- back, so the timers that waited meanwhile do not start back to back; a start a few
      -- ms late keeps the rate's pace (a 500/s rate would lose a fifth of its starts
      -- otherwise)
      local tat = tonumber(redis.call('HGET', state, 'tat') or '0') or 0
      local floor = now + p.a - RATE_JITTER_MS
      if tat < floor then redis.call('HSET', state, 'tat', ms_text(floor)) end
    end
    rate_keep(state)
    if paid then promote_rate(ARGV[1], p.name, p.a, p.b, now) end
  end
  -- A rate slot is paid for only at its own time: a run given one (R) that finds its key
  -- full gives it up and asks the rate again when the key lets it go, so starts are never
  -- closer than the interval however long it waited for the key (a paid slot carried
  -- through a key's queue let several paid runs start at once as slots freed).
  if key ~= '' and not take_slot(token, id, record, due, key, limit, p.state == 'C') then
    counts.waited = counts.waited + 1
    local waiting = {state = 'c', a = limit, b = lease, c = 0, name = key}
    local status = hold(token, id, record, due, flow_key(ARGV[1], 'waitk', key), waiting, rk,
      reruns)
    promote_key(ARGV[1], key, limit, now)
    -- a pacer whose slot came before the server's start (T21) is the pacer no more: the
    -- rate's next slot goes on now (a paid pacer's went on above), else the timers waiting
    -- for the rate would have no pacer until some gate asked the rate again
    if slot_lost then promote_rate(ARGV[1], p.name, p.a, p.b, now) end
    return status
  end
  local again = rate ~= '' and not paid and retake_rate(token, rate, interval)
  if rate ~= '' and not paid and not again and not take_rate(rate, interval, burst) then
    counts.rate_limited = counts.rate_limited + 1
    local waiting = {state = 'r', a = interval, b = burst, c = 0, name = rate}
    local status = hold(token, id, record, due, flow_key(ARGV[1], 'waitr', rate), waiting, rk,
      reruns)
    if key ~= '' then
      -- it keeps its place in its key's order while it waits for its rate (the order
      -- barrier, "r|…": the key's later timers wait behind it), a run next in line after
      -- it goes back to wait behind it (take_back_next), and the slot it took, or was
      -- handed with, goes to the key's queue in order: to a timer ahead of it, if any
      if status == 'wait' then
        note_ungated(ARGV[1], id, 'r|' .. barrier_of(record), record, due)
      end
      take_back_next(ARGV[1], token)
      redis.call('ZREM', flow_key(ARGV[1], 'slots', key), token)
      release_slot(ARGV[1], token, now)
      promote_key(ARGV[1], key, limit, now)
    end
    promote_rate(ARGV[1], rate, interval, burst, now)
    return status
  end
  if key ~= '' then
    redis.call('HSET', sys_key(ARGV[1], 'held'), token, limit .. '|' .. lease .. '|' .. key)
  end
  local rated = paid and p.name or rate
  if rated ~= '' then  -- the rate's last start, and whose (retake_rate)
    local state = flow_key(ARGV[1], 'rate', rated)
    redis.call('HSET', state, 'last', ms_text(now), 'by', token .. '|' .. ms_text(now))
  end
  if record_option(record, 'w') and not again then  -- (counted at its first go)
    counts.held_ms = counts.held_ms + math.max(now - due, 0)
  end
  return 'go'
end

-- declare {
local runs = (#ARGV - 3) / 6
for i = 4, #ARGV, 6 do  -- each run's group, queues, slots and rate, and what they let go
  local token, key, limit, rate = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3]
  local reruns, _, due, id, record = run_read(redis.call('HGET', KEYS[2], token))
  if record then
    need(running_key_for(KEYS[1], record_group(record)))
    due = tonumber(record_option(record, 'w') or due) or tonumber(due)
    need_timer(ARGV[1], id, with_reruns(record, reruns))  -- pended again (too early)
    need_barrier(ARGV[1], record)
    need_promoted(ARGV[1], id, with_reruns(with_waited_from(record, due), reruns))  -- held
    local p = parked_read(redis.call('HGET', parked_key, id))
    if p and (p.state == 'R' or p.state == 'r') then need_rate(ARGV[1], p.name, runs + 1) end
  end
  if key ~= '' then
    need_key(ARGV[1], key, limit)
    need_release(ARGV[1], token)
    need_taken_back(ARGV[1], token)
  end
  if rate ~= '' then need_rate(ARGV[1], rate, runs + 1) end
end
need_barred(ARGV[1])
local asked = keys_asked()
if asked then return asked end
-- declare }
local out = {}
for i = 4, #ARGV, 6 do
  out[#out + 1] = gate(ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2]), ARGV[i + 3],
    tonumber(ARGV[i + 4]), tonumber(ARGV[i + 5]))
end
promote_barred(ARGV[1], now)  -- the runs gated here may have lifted the order barrier
for name, n in pairs(counts) do
  if n > 0 then redis.call('HINCRBY', KEYS[4], name, n) end
end
wake(ARGV[2])
return out
