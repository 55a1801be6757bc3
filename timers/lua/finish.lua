#!lua flags=allow-oom
-- finish.lua: end runs. Count successes, record failures, put retries and handed-back
-- runs back in the due index.
--
-- KEYS[1]  running: zset, run token -> lease deadline ms
-- KEYS[2]  running records: hash, run token -> "reruns@<listener>|due|<id>:<record>"
-- KEYS[3]  stats: hash of counters
-- KEYS[4]  failures: zset, failure id -> time of failure ms
-- KEYS[5]  failure records: hash, failure id -> JSON
-- KEYS[6]  due index: zset, escaped id -> due ms
-- KEYS[7]  records: hash, escaped id -> record
-- KEYS[8]  failure index: zset (all scores 0) of dead timers' failure ids "<id>:<token>"
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  failure retention ms: older failure records are trimmed, a few per call
-- ARGV[4..] four values per ending: token, kind, a, b:
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
--   token "release" "" ""             hand an unfinished run back: pending again, at its
--                                     old due time, so another listener runs it at once
--
-- allow-oom: it frees leases and adds at most what it frees plus failure records, and a
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
-- Returns the number of late finishes.
local KINDS = {ok = true, skip = true, fail = true, reject = true, retry = true,
               release = true}
local retention = string.match(ARGV[3] or '', '^%d+$') and tonumber(ARGV[3])
if not retention or (#ARGV - 3) % 4 ~= 0 then
  return redis.error_reply('ERR timers finish: bad arguments')
end
local released = {}
for i = 4, #ARGV, 4 do
  local token, kind, a, b = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local bad = not KINDS[kind] or ((token == '') ~= (kind == 'reject'))
  if kind == 'fail' or kind == 'reject' then
    bad = bad or a == '' or b == ''
  elseif kind == 'retry' then
    bad = bad or not string.match(a, '^[^:]+:[^:]+:') or not string.match(b, '^%d+$')
  end
  if bad then
    return redis.error_reply('ERR timers finish: bad ending ' .. ((i - 4) / 4 + 1) ..
      ' (' .. kind .. ')')
  end
  if kind == 'release' then
    local run = redis.call('HGET', KEYS[2], token)
    if run then
      local due, id, record = string.match(run, '^[^|]*|(%-?%d+)|([^:]+):(.*)$')
      if due then
        released[i] = {id, record, tonumber(due)}
      else
        released[i] = false
        redis.log(redis.LOG_WARNING, 'timers: unreadable run record, lease kept: ' .. token)
      end
    end
  end
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local counts = {fired = 0, failed = 0, rejected = 0, retried = 0, handed_back = 0,
                skipped = 0, late_finishes = 0}
local earliest

local function drop_rejected(id)
  local rec = redis.call('HGET', KEYS[5], id)
  if rec and string.find(rec, '"kind": "rejected"', 1, true) then
    redis.call('HDEL', KEYS[5], id)
    redis.call('ZREM', KEYS[4], id)
  end
end

local function pend(id, record, due)
  if redis.call('HEXISTS', KEYS[7], id) == 1 then return false end
  redis.call('HSET', KEYS[7], id, record)
  local due_text = string.format('%.0f', due)
  redis.call('ZADD', KEYS[6], due_text, id)
  if due > now then
    redis.call('SET', ARGV[1] .. id .. ':' .. record, '1', 'PXAT', due_text)
  end
  if not earliest or due < earliest then earliest = due end
  drop_rejected(id)
  return true
end

local function dead_recorded(id)
  return #redis.call('ZRANGEBYLEX', KEYS[8], '[' .. id .. ':', '(' .. id .. ';',
    'LIMIT', 0, 1) > 0
end

local head = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
for i = 4, #ARGV, 4 do
  local token, kind, a, b = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if kind == 'reject' then
    local plain = not string.find(a, ':', 1, true)
    if not (plain and dead_recorded(a)) and redis.call('HSETNX', KEYS[5], a, b) == 1 then
      redis.call('ZADD', KEYS[4], now, a)
      counts.rejected = counts.rejected + 1
    end
  elseif released[i] ~= false then
    local held = redis.call('ZREM', KEYS[1], token) == 1
    redis.call('HDEL', KEYS[2], token)
    if not held then
      counts.late_finishes = counts.late_finishes + 1
    elseif kind == 'ok' then
      counts.fired = counts.fired + 1
    elseif kind == 'skip' then
      counts.skipped = counts.skipped + 1
    elseif kind == 'fail' then
      redis.call('ZADD', KEYS[4], now, a)
      redis.call('HSET', KEYS[5], a, b)
      local id = string.match(a, '^([^:]+):')
      if id then
        redis.call('ZADD', KEYS[8], 0, a)
        drop_rejected(id)
      end
      counts.failed = counts.failed + 1
    elseif kind == 'retry' then
      local id, record = string.match(a, '^([^:]+):(.*)$')
      if pend(id, record, now + tonumber(b)) then counts.retried = counts.retried + 1 end
    elseif kind == 'release' and released[i] then
      local r = released[i]
      if pend(r[1], r[2], r[3]) then counts.handed_back = counts.handed_back + 1 end
    end
  end
end

for name, n in pairs(counts) do
  if n > 0 then redis.call('HINCRBY', KEYS[3], name, n) end
end
if counts.failed + counts.rejected > 0 then
  local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - retention,
    'LIMIT', 0, 2 * (counts.failed + counts.rejected))
  for _, failure_id in ipairs(old) do
    redis.call('ZREM', KEYS[4], failure_id)
    redis.call('HDEL', KEYS[5], failure_id)
    redis.call('ZREM', KEYS[8], failure_id)
  end
end
if earliest and (not head[2] or earliest < tonumber(head[2])) then
  redis.pcall('PUBLISH', ARGV[2], string.format('%.0f', earliest))
end
return counts.late_finishes
