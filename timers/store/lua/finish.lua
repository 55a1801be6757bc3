#!lua flags=allow-oom
-- finish.lua: end runs. Count successes, record failures, put retries and handed-back
-- runs back in the due index.
-- State machine: docs/state-machine.md (transitions T12 to T14, T16 to T18, T20).
--
-- KEYS[1]  running: zset, run token -> lease deadline ms
-- KEYS[2]  running records: hash, run token -> "reruns@<listener>|due|<id>:<record>"
-- KEYS[3]  stats: hash of counters
-- KEYS[4]  failures: zset, failure id -> time of failure ms
-- KEYS[5]  failure records: hash, failure id -> JSON
-- KEYS[6]  due index: zset, escaped id -> due ms
-- KEYS[7]  records: hash, escaped id -> record
-- KEYS[8]  failure index: zset (all scores 0) of dead timers' failure ids "<id>:<token>"
-- KEYS[9]  sequence: counter that numbers run tokens (and names history batches)
-- KEYS[10] history: zset, batch id -> end ms (history.lua)
-- KEYS[11] history records: hash, escaped id -> "<batch id>|<record>"
-- KEYS[12] series: hash, "<task>|<slot>" -> minute slot (history.lua)
-- KEYS[13] series tasks: hash, task -> last minute written
-- KEYS[14] history retention: string "<age ms> <count>" (set to ARGV[9] ARGV[10] when the
--          call trims, for cancel.lua)
-- KEYS[15] history expiry: zset, batch id -> when its records expire, ms (history.lua)
-- KEYS[16] history task ages: hash, task -> its own age ms (set from the task entries)
-- KEYS[17] history batches: hash, batch id -> the escaped ids it wrote (history.lua)
-- KEYS[18] history task counts: hash, task -> its own count (set from the task entries)
-- KEYS[19] history dead ends: zset, escaped id -> end ms (history.lua)
-- KEYS[20..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  failure retention ms: older failure records are trimmed, a few per call
-- ARGV[4]  the finishing listener's id (no '|')
-- ARGV[5]  the groups it serves, joined by ","
-- ARGV[6]  take: how many timers a freed key slot may hand it as runs (its free slots)
-- ARGV[7]  lease ms of those runs
-- ARGV[8]  "1": it also takes runs next in line (see below), "0": not
-- ARGV[9]  history age ms, ARGV[10] history count: the history keeps ended timers that
--          long (unless their task has an age of its own: see the endings) and at most
--          that many (either 0: it keeps none, whatever the tasks' ages)
-- ARGV[11] "1": KEYS[14] is set (a listener sends it about once a second), "0": not. The
--          history is not trimmed here: each listener's trim.lua calls do it, a bounded
--          step at a time, idle or not
-- ARGV[12] S: how many series entries follow
-- ARGV[13..12+2S] per series entry: task, minute slot text (added to the task's ring; a
--          listener sums its runs per task and minute over about a second, so a slot is
--          written about once a second per task, whatever the batches)
-- then T: how many task entries follow, and per entry: task, its own history age ms
--          ("": none of its own) stored in KEYS[16] for cancel.lua (or dropped from it),
--          its own history count ("": none) stored in KEYS[18] and its task zset
--          (history.lua) trimmed to it, or, "", dropped from KEYS[18] (its zset stays:
--          it is the task's index); a listener sends its tasks' once, with its first
--          call that sets KEYS[14]
-- then seven values per ending: token, kind, a, b, id, record, keep, where id, record and
-- keep are "" or, for an ending that ends its timer (ok, skip, fail), its escaped id,
-- history record and "<age>" or "<age>|<count>": the ms its task keeps it ("": ARGV[9];
-- else more than 0) and how many of its task's records are kept at most, when its task
-- has a count of its own (1 or more): kept in the history when the ending is written, in
-- this call's batch of its age (one per distinct age: end now, expiry now + age;
-- history.lua) (not for a late finish: the run that holds the timer now ends it), in its
-- task's zset, and a dead one in KEYS[19] (score: the record's end): one ZADD per task and
-- call, one more for the dead. With a count its task's zset is then trimmed to the count.
-- The count rides with each ending, not read from KEYS[18]: a task without one costs no
-- command. Of the record only its first field, its end and its task are checked (its
-- readers skip one that does not read otherwise).
-- The first four:
--   token "ok"      "" ""             the run succeeded
--   token "skip"    "" ""             the run was skipped on purpose (counted only)
--   token "fail"    failure-id JSON   the run failed for good: record it. A dead timer's
--                                     failure id is "<id>:<token>", one per dead timer,
--                                     so no later timer with that id can replace it
--   ""    "reject"  failure-id JSON   an event named no runnable timer: record it only
--                                     where no record has that id and, for "<id>", no
--                                     dead timer with that id is recorded (a run's
--                                     record wins)
--   token "retry"   entry delay-ms    run "<id>:<record>" again after delay-ms
--   token "release" grace-ms holder   hand an unfinished run back: pending again, at its
--                                     old due time, so another listener runs it at once.
--                                     It keeps its place in its key's order (T17): a
--                                     concurrency key slot it held is kept for the timer
--                                     (its run next in line goes back into the key's
--                                     queue), a run next in line after `holder` goes back
--                                     into its key's queue, and one not gated yet, or that
--                                     held a slot, bars its key's later timers while it is
--                                     pending (flow.lua barred). With grace-ms (a run whose
--                                     task may still be going in a process about to exit)
--                                     the timer comes due again grace-ms from now (its
--                                     lateness still counting from its old due time): the
--                                     key runs nothing else while the task may still run,
--                                     and the timer goes first. Its run may have started,
--                                     so the record carries its reruns + 1 (";rc=", T17):
--                                     the next start is a rerun, counted (`reruns`)
--   token "move"    entry due-ms      pending again as "<id>:<record>" (its task's group
--                                     differs) at due-ms, uncounted as an attempt
--   token "wait"    entry due-ms      as "move", in the same group: left unmoved on a
--                                     group disagreement (timers/model/flow/disagreement.py);
--                                     counted by neither
--
-- A run's lease is in the running set of its record's group (KEYS[1], or "<it>|<group>",
-- see prelude.lua); a slot of a concurrency key it held is freed, and the next timer
-- waiting for that key goes back into its due index (flow.lua), or, while ARGV[6] allows
-- and its group is served, straight to this listener as a run holding the slot: no wake,
-- no claim, no other listener racing for it (source "h", handed over). With ARGV[8], each
-- run it is handed holding a slot also brings the key's next waiting timer, as the run
-- next in line after it (source "n@<token>", flow.lua's hand_next): the listener starts
-- it the moment the first ends, and its slot passes on when that ending is written here.
-- allow-oom: it frees leases and adds at most what it frees plus failure and history
-- records (trimmed to their retention) and fixed-size series slots, and a
-- refused finish would leave runs to lapse and run twice. Every ending is checked before
-- the first write: a bad one fails the whole call and writes nothing. A handed-back run
-- whose stored run record does not read keeps its lease, which lapses: it runs again.
-- A token no longer held (its lease lapsed and another listener took the run over) is
-- counted as a late finish and changes nothing else: the run that holds it now decides.
-- Retries and hand-backs do not overwrite a timer scheduled again under the same id in
-- the meantime: the newer schedule wins; a run that goes back to pending drops the
-- rejected-event record of its id (the event was for a timer that runs after all).
-- A re-added timer's key is named by its record, so it is built here from ARGV[1].
-- The wake is a PUBLISH by pcall: it cannot fail the writes before it.
-- Returns {late finishes, then per handed-over run: token, run, "h" or "n@<token>"}.
local KINDS = {ok = true, skip = true, fail = true, reject = true, retry = true,
               release = true, move = true, wait = true}
-- Endings of a run that may never have been gated (handed back, moved, or failed before
-- its start: its crashes reached the limit, its task refused): its note in the order
-- barrier (claim.lua note_ungated) is dropped with it. A run that started was gated.
local UNGATED_ENDS = {fail = true, release = true, move = true, wait = true}

-- An error reply when ending n (token, kind, a, b) does not read, else nil.
local function bad_ending(n, token, kind, a, b)
  local bad = not KINDS[kind] or ((token == '') ~= (kind == 'reject'))
  if kind == 'fail' or kind == 'reject' then
    bad = bad or a == '' or b == ''
  elseif kind == 'retry' or kind == 'move' or kind == 'wait' then
    bad = bad or not string.match(a, '^[^:]+:[^:]+:') or not is_count(b)
  elseif kind == 'release' then
    bad = bad or (a ~= '' and not is_count(a)) or (b ~= '' and not is_count(b))
  end
  if bad then
    return redis.error_reply('ERR timers finish: bad ending ' .. n .. ' (' .. kind .. ')')
  end
  return nil
end

-- What a release hands back, read from the run's record: {id, record, due}; false when
-- that record does not read (the lease is kept, and lapses); nil when there is none.
-- A run `cut` (its task may have started) comes back with one rerun more.
local function released_run(token, cut)
  local run = redis.call('HGET', KEYS[2], token)
  if not run then return nil end
  local reruns, due, id, record = string.match(run, '^(%d*)[^|]*|(%-?%d+)|([^:]+):(.*)$')
  if due then
    return {id, with_reruns(record, (tonumber(reruns) or 0) + (cut and 1 or 0)), tonumber(due),
            cut}
  end
  redis.log(redis.LOG_WARNING, 'timers: unreadable run record, lease kept: ' .. token)
  return false
end

local retention = is_count(ARGV[3]) and tonumber(ARGV[3])
if not retention or not is_count(ARGV[6]) or not is_count(ARGV[7])
    or (ARGV[8] ~= '0' and ARGV[8] ~= '1') or not is_count(ARGV[9]) or not is_count(ARGV[10])
    or (ARGV[11] ~= '0' and ARGV[11] ~= '1') or not is_count(ARGV[12]) then
  return redis.error_reply('ERR timers finish: bad arguments')
end
local SERIES = 13  -- the first series entry's first value
local AGES = SERIES + 2 * tonumber(ARGV[12])  -- the task entries' count
if AGES > #ARGV or not is_count(ARGV[AGES]) then
  return redis.error_reply('ERR timers finish: bad arguments')
end
local FIRST = AGES + 1 + 3 * tonumber(ARGV[AGES])  -- the first ending's first value
local STRIDE = 7
if FIRST > #ARGV + 1 or (#ARGV - FIRST + 1) % STRIDE ~= 0 then
  return redis.error_reply('ERR timers finish: bad arguments')
end
for i = SERIES, AGES - 1, 2 do
  if ARGV[i] == '' or string.find(ARGV[i], '|', 1, true) or not series_text_ok(ARGV[i + 1]) then
    return redis.error_reply('ERR timers finish: bad series entry ' .. ((i - SERIES) / 2 + 1))
  end
end
local entry_tasks = {}
for i = AGES + 1, FIRST - 1, 3 do
  if ARGV[i] == '' or string.find(ARGV[i], '|', 1, true) or entry_tasks[ARGV[i]]
      or (ARGV[i + 1] ~= '' and not is_count(ARGV[i + 1]))
      or (ARGV[i + 2] ~= '' and not is_count(ARGV[i + 2])) then
    return redis.error_reply('ERR timers finish: bad task entry ' .. ((i - AGES - 1) / 3 + 1))
  end
  entry_tasks[ARGV[i]] = true
end
local history_age, history_count = tonumber(ARGV[9]), tonumber(ARGV[10])
local keep_history = history_age > 0 and history_count > 0
local released = {}
-- Per ending index: its age ("" or ms: its keep value without a count); for an ending
-- with a history record, {task, end ms, its task's own count or nil} (as text)
local ages, indexed = {}, {}
for i = FIRST, #ARGV, STRIDE do
  local token, kind, hid, hage = ARGV[i], ARGV[i + 1], ARGV[i + 4], ARGV[i + 6]
  local bad = bad_ending((i - FIRST) / STRIDE + 1, token, kind, ARGV[i + 2], ARGV[i + 3])
  if bad then return bad end
  local hcount, has = nil, hid ~= '' or ARGV[i + 5] ~= '' or hage ~= ''
  if hage ~= '' and string.find(hage, '|', 1, true) then
    hage, hcount = string.match(hage, '^(%d*)|(%d+)$')
  end
  local ok = hage ~= nil
  if ok and hid ~= '' then
    local ended, task = history_text_task(ARGV[i + 5])
    ok = ended ~= nil and (hcount == nil or tonumber(hcount) > 0)
    indexed[i] = {task, ended, hcount}
  end
  if has and not (ok and (kind == 'ok' or kind == 'skip' or kind == 'fail') and hid ~= ''
      and string.sub(ARGV[i + 5], 3, 3) == '|'
      and (hage == '' or (is_count(hage) and tonumber(hage) > 0))) then
    return redis.error_reply('ERR timers finish: bad history record of ending ' ..
      ((i - FIRST) / STRIDE + 1))
  end
  ages[i] = hage
  if kind == 'release' then
    released[i] = released_run(token, ARGV[i + 2] ~= '' and tonumber(ARGV[i + 2]) > 0)
  end
end

-- declare {
for i = FIRST, #ARGV, STRIDE do  -- each run's group, the slot it holds, where it goes
  local token, kind, a = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if kind ~= 'reject' then
    local run_record = need_run(ARGV[1], token)
    if run_record and UNGATED_ENDS[kind] then  -- its place in the order barrier, if noted
      need(flow_key(ARGV[1], 'ungated', barrier_of(run_record)))
    end
    need_release(ARGV[1], token)
    if kind ~= 'release' then  -- leave_flow: what flow control kept for its timer
      local id = select(4, run_read(redis.call('HGET', sys_key(ARGV[1], 'runrec'), token)))
      if id then need_unpark(ARGV[1], id) end
    end
    if kind == 'release' and ARGV[i + 3] ~= '' then need_release(ARGV[1], ARGV[i + 3]) end
    if kind == 'retry' or kind == 'move' or kind == 'wait' then
      local id, record = string.match(a, '^([^:]+):(.*)$')
      need_timer(ARGV[1], id, record)
    elseif kind == 'release' and released[i] then
      local id, record, due = released[i][1], released[i][2], released[i][3]
      need_timer(ARGV[1], id, record)
      need_timer(ARGV[1], id, with_waited_from(record, due))
    end
  end
end
need_barred(ARGV[1])
for _, one in pairs(indexed) do need(history_task_key(KEYS[10], one[1])) end
for i = AGES + 1, FIRST - 1, 3 do  -- a task zset trimmed to its count
  if ARGV[i + 2] ~= '' then need(history_task_key(KEYS[10], ARGV[i])) end
end
local asked = keys_asked()
if asked then return asked end
-- declare }
local now, now_us = redis_now()
local counts = {fired = 0, failed = 0, rejected = 0, retried = 0, handed_back = 0,
                skipped = 0, late_finishes = 0, routed = 0, reruns = 0}

-- Drop the rejected-event record of timer `id`: the failure id of a rejected event is the
-- escaped timer id itself (a dead timer's is "<id>:<token>", and an escaped id holds no
-- ':'), so the id alone says which record it is; its JSON is never read here.
local function drop_rejected(id)
  if redis.call('HDEL', KEYS[5], id) == 1 then redis.call('ZREM', KEYS[4], id) end
end

-- Pending again, unless a timer was scheduled under that id meanwhile (it wins).
local function pend_again(id, record, due)
  if redis.call('HEXISTS', KEYS[7], id) == 1 then return false end
  pend(KEYS[6], KEYS[7], ARGV[1], id, record, due, now)
  drop_rejected(id)
  return true
end

local function dead_recorded(id)
  return #redis.call('ZRANGEBYLEX', KEYS[8], '[' .. id .. ':', '(' .. id .. ';',
    'LIMIT', 0, 1) > 0
end

local function reject(id, json)
  local plain = not string.find(id, ':', 1, true)
  if not (plain and dead_recorded(id)) and redis.call('HSETNX', KEYS[5], id, json) == 1 then
    redis.call('ZADD', KEYS[4], now, id)
    counts.rejected = counts.rejected + 1
  end
end

local function fail(failure_id, json)
  redis.call('ZADD', KEYS[4], now, failure_id)
  redis.call('HSET', KEYS[5], failure_id, json)
  local id = string.match(failure_id, '^([^:]+):')
  if id then
    redis.call('ZADD', KEYS[8], 0, failure_id)
    drop_rejected(id)
  end
  counts.failed = counts.failed + 1
end

-- End the run held under token; a token no longer held is a late finish.
-- Whether the run's lease was still held (it is in its group's running set): removed.
local function unlease(token)
  if redis.call('ZREM', KEYS[1], token) == 1 then return true end
  local record = select(5, run_read(redis.call('HGET', KEYS[2], token)))
  local group = record and record_group(record) or DEFAULT_GROUP
  return group ~= DEFAULT_GROUP and
    redis.call('ZREM', running_key_for(KEYS[1], group), token) == 1
end

local slots_held = redis.call('EXISTS', sys_key(ARGV[1], 'held')) == 1
local any_parked = redis.call('EXISTS', sys_key(ARGV[1], 'parked')) == 1

-- A run that ends without having passed its gate (ended the same way as the run a dead
-- process of its host had finished, missed, refused, moved) leaves what flow control kept
-- for its timer: the slot of its key kept for it since it was promoted ("w:<id>"), or its
-- rate's next slot (its pacer). Both go on to the next in line (unpark), else they would
-- hold the key or the rate until a gate of that key or rate came by, and none comes while
-- every later timer waits in their queue (T25). Not when a newer timer has the id: one
-- pending again (its record in KEYS[7]) or claimed (its own note in the order barrier).
local function leave_flow(token, id)
  if redis.call('HEXISTS', sys_key(ARGV[1], 'parked'), id) == 0
      or redis.call('HEXISTS', KEYS[7], id) == 1 then
    return
  end
  local note = redis.call('HGET', sys_key(ARGV[1], 'ungatedt'), id)
  if note and note ~= token and not string.match(note, '^[pr]|') then return end
  unpark(ARGV[1], id)
end

local kept = 0  -- history records to write, as HSET arguments (one call)
local history_texts = {}
-- This call's history batches, one per distinct age: age -> {batch id, expiry text, its
-- ids}, and in the order made. The scores are text, made once per batch (a number passed
-- to redis.call is formatted anew each time).
local history_batches, history_order = {}, {}
-- The task zsets this call adds to: task -> {ZADD arguments, count or nil}, in the order
-- met; and the dead ends' ZADD arguments.
local task_adds, task_order, dead_adds = {}, {}, {}

local function end_run(token, kind, a, b, release, hid, htext, hage, hindexed)
  if kind == 'release' and b ~= ''
      and redis.call('HGET', sys_key(ARGV[1], 'next'), b) == token
      and take_back_next(ARGV[1], b, false) then  -- next in line: back in its key's queue
    counts.handed_back = counts.handed_back + 1
    return
  end
  if not unlease(token) then
    redis.call('HDEL', KEYS[2], token)
    counts.late_finishes = counts.late_finishes + 1
    return
  end
  local noted = nil  -- {id, record} of a run handed back before its gate: it keeps its note
  local note = nil  -- its timer's entry in the order barrier's tokens, if any
  if UNGATED_ENDS[kind] then
    local _, _, _, id, record = run_read(redis.call('HGET', KEYS[2], token))
    local tokens = sys_key(ARGV[1], 'ungatedt')
    note = record and redis.call('HGET', tokens, id)
    if note == token then
      if kind == 'release' then
        redis.call('HSET', tokens, id, 'p|' .. barrier_of(record))
        noted = {id, record}
      else
        drop_ungated(ARGV[1], id, record)
      end
    end
  end
  if any_parked and kind ~= 'release' then
    local id = select(4, run_read(redis.call('HGET', KEYS[2], token)))
    if id then leave_flow(token, id) end
  end
  redis.call('HDEL', KEYS[2], token)
  if hid ~= '' and keep_history then
    kept = kept + 1
    local batch = history_batches[hage]
    if not batch then
      batch = {history_batch(KEYS[9], token),
               string.format('%.0f', now + (hage == '' and history_age or tonumber(hage))), {}}
      history_batches[hage] = batch
      history_order[#history_order + 1] = batch
    end
    local ids = batch[3]
    ids[#ids + 1] = hid
    history_texts[2 * kept - 1], history_texts[2 * kept] = hid, batch[1] .. '|' .. htext
    local adds = task_adds[hindexed[1]]
    if not adds then
      adds = {{}}
      task_adds[hindexed[1]] = adds
      task_order[#task_order + 1] = hindexed[1]
    end
    local args = adds[1]
    args[#args + 1], args[#args + 2] = hindexed[2], hid
    adds[2] = hindexed[3] or adds[2]
    if kind == 'fail' then
      dead_adds[#dead_adds + 1], dead_adds[#dead_adds + 2] = hindexed[2], hid
    end
  end
  local grace = kind == 'release' and tonumber(a) or 0
  if release and slots_held and redis.call('HEXISTS', KEYS[7], release[1]) == 0
      and keep_slot_for(ARGV[1], token, release[1],
                        grace > 0 and now + grace or math.max(now, release[3])) then
    if not note then  -- (noted: its own token was there)
      -- gated, it keeps its place among its key's later timers too while it is pending
      -- (a later one would take a free slot first: a start window missed, T17)
      note_ungated(ARGV[1], release[1], 'p|' .. barrier_of(release[2]), release[2],
        release[3])
      noted = {release[1], release[2]}
    end
    release[2] = with_waited_from(release[2], release[3])
    if grace > 0 then release[3] = now + grace end
  elseif slots_held then
    release_slot(ARGV[1], token, now)
  end
  if kind == 'ok' then
    counts.fired = counts.fired + 1
  elseif kind == 'skip' then
    counts.skipped = counts.skipped + 1
  elseif kind == 'fail' then
    fail(a, b)
  elseif kind == 'retry' then
    local id, record = string.match(a, '^([^:]+):(.*)$')
    if pend_again(id, record, now + tonumber(b)) then counts.retried = counts.retried + 1 end
  elseif kind == 'move' then
    local id, moved = string.match(a, '^([^:]+):(.*)$')
    if pend_again(id, moved, tonumber(b)) then counts.routed = counts.routed + 1 end
  elseif kind == 'wait' then
    local id, waiting = string.match(a, '^([^:]+):(.*)$')
    pend_again(id, waiting, tonumber(b))
  elseif kind == 'release' and release then
    if pend_again(release[1], release[2], release[3]) then
      counts.handed_back = counts.handed_back + 1
      if release[4] then counts.reruns = counts.reruns + 1 end
    elseif noted then  -- a newer timer has its id: the run's place is nobody's
      drop_ungated(ARGV[1], noted[1], noted[2])
    end
  end
end

local function trim_failures(n)
  local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - retention, 'LIMIT', 0, 2 * n)
  for _, failure_id in ipairs(old) do
    redis.call('ZREM', KEYS[4], failure_id)
    redis.call('HDEL', KEYS[5], failure_id)
    redis.call('ZREM', KEYS[8], failure_id)
  end
end

local handed = {0}
if tonumber(ARGV[6]) > 0 or ARGV[8] == '1' then
  local served = {}
  for group in string.gmatch(ARGV[5], '[^,]+') do served[group] = true end
  local lease_until = string.format('%.0f', now + tonumber(ARGV[7]))
  local me = '@' .. string.gsub(ARGV[4], '|', '_')
  taker = {budget = tonumber(ARGV[6]), served = served, lease_until = lease_until, held_ms = 0,
    follow = ARGV[8] == '1',
    start = function(run, group, source)
      local token = string.format('%.0f', new_tokens(KEYS[9], 1, now_us) + 1)
      redis.call('ZADD', running_key_for(KEYS[1], group), lease_until, token)
      local held = record_reruns(string.match(run, '^|[^|]*|[^:]*:(.*)$') or '') .. me .. run
      redis.call('HSET', KEYS[2], token, held)
      handed[#handed + 1] = token
      handed[#handed + 1] = held
      handed[#handed + 1] = source
      return token
    end}
end

for i = FIRST, #ARGV, STRIDE do
  if ARGV[i + 1] == 'reject' then
    reject(ARGV[i + 2], ARGV[i + 3])
  elseif released[i] ~= false then
    end_run(ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], released[i], ARGV[i + 4],
      ARGV[i + 5], ages[i], indexed[i])
  end
end
if kept > 0 then
  each_thousand('HSET', KEYS[11], history_texts)  -- field, value pairs: 1000 is even
  local now_text = string.format('%.0f', now)
  for _, batch in ipairs(history_order) do
    history_index(KEYS[10], KEYS[15], KEYS[17], batch[1], table.concat(batch[3], ':'),
      now_text, batch[2])
  end
  for _, task in ipairs(task_order) do  -- each task's records, then a count's trim
    local key, adds = history_task_key(KEYS[10], task), task_adds[task]
    each_thousand('ZADD', key, adds[1])  -- score, member pairs: 1000 is even
    if adds[2] then
      history_task_trim(key, KEYS[11], task, tonumber(adds[2]), #adds[1] / 2 + 1000)
    end
  end
  each_thousand('ZADD', KEYS[19], dead_adds)
end
for i = SERIES, AGES - 1, 2 do series_add(KEYS[12], KEYS[13], ARGV[i], ARGV[i + 1]) end
for i = AGES + 1, FIRST - 1, 3 do
  local task, age, count = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if age == '' then
    redis.call('HDEL', KEYS[16], task)
  else
    redis.call('HSET', KEYS[16], task, age)
  end
  if count ~= '' then
    redis.call('HSET', KEYS[18], task, count)
    history_task_trim(history_task_key(KEYS[10], task), KEYS[11], task, tonumber(count), 1000)
  else
    redis.call('HDEL', KEYS[18], task)
  end
end
if ARGV[11] ~= '0' then
  local retention_text = ARGV[9] .. ' ' .. ARGV[10]
  if redis.call('GET', KEYS[14]) ~= retention_text then
    redis.call('SET', KEYS[14], retention_text)
  end
end
promote_barred(ARGV[1], now)  -- a run that ended ungated may have lifted the barrier
if taker then counts.held_ms = taker.held_ms end
for name, n in pairs(counts) do
  if n > 0 then redis.call('HINCRBY', KEYS[3], name, n) end
end
if counts.failed + counts.rejected > 0 then trim_failures(counts.failed + counts.rejected) end
wake(ARGV[2])
handed[1] = counts.late_finishes
return handed
