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
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  failure retention ms: older failure records are trimmed, a few per call
-- ARGV[4..] four values per ending: token, kind, a, b:
--   token "ok"      "" ""             the run succeeded
--   token "skip"    "" ""             the run was skipped on purpose (counted only)
--   token "fail"    failure-id JSON   the run failed for good: record it
--   ""    "reject"  failure-id JSON   an event named no runnable timer: record it only
--                                     where no record has that id (a run's record wins)
--   token "retry"   entry delay-ms    run "<id>:<record>" again after delay-ms
--   token "release" "" ""             hand an unfinished run back: pending again, at its
--                                     old due time, so another listener runs it at once
--
-- A token no longer held (its lease lapsed and another listener took the run over) is
-- counted as a late finish and changes nothing else: the run that holds it now decides.
-- Retries and hand-backs do not overwrite a timer scheduled again under the same id in
-- the meantime: the newer schedule wins. A re-added timer's key is named by its record,
-- so it is built here from ARGV[1].
-- Returns the number of late finishes.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local counts = {fired = 0, failed = 0, rejected = 0, retried = 0, handed_back = 0,
                skipped = 0, late_finishes = 0}
local earliest

local function pend(id, record, due)
  if redis.call('HEXISTS', KEYS[7], id) == 1 then return false end
  redis.call('HSET', KEYS[7], id, record)
  local due_text = string.format('%.0f', due)
  redis.call('ZADD', KEYS[6], due_text, id)
  if due > now then
    redis.call('SET', ARGV[1] .. id .. ':' .. record, '1', 'PXAT', due_text)
  end
  if not earliest or due < earliest then earliest = due end
  return true
end

local head = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
for i = 4, #ARGV, 4 do
  local token, kind, a, b = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  if kind == 'reject' then
    if redis.call('HSETNX', KEYS[5], a, b) == 1 then
      redis.call('ZADD', KEYS[4], now, a)
      counts.rejected = counts.rejected + 1
    end
  else
    local run = redis.call('HGET', KEYS[2], token)
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
      counts.failed = counts.failed + 1
    elseif kind == 'retry' then
      local id, record = string.match(a, '^([^:]+):(.*)$')
      if pend(id, record, now + tonumber(b)) then
        redis.call('HDEL', KEYS[5], id)
        redis.call('ZREM', KEYS[4], id)
        counts.retried = counts.retried + 1
      end
    elseif kind == 'release' and run then
      local due, id, record = string.match(run, '^[^|]*|(%d+)|([^:]+):(.*)$')
      if pend(id, record, tonumber(due)) then counts.handed_back = counts.handed_back + 1 end
    end
  end
end

for name, n in pairs(counts) do
  if n > 0 then redis.call('HINCRBY', KEYS[3], name, n) end
end
if counts.failed + counts.rejected > 0 then
  local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[3]),
    'LIMIT', 0, 2 * (counts.failed + counts.rejected))
  for _, failure_id in ipairs(old) do
    redis.call('ZREM', KEYS[4], failure_id)
    redis.call('HDEL', KEYS[5], failure_id)
  end
end
if earliest and (not head[2] or earliest < tonumber(head[2])) then
  redis.call('PUBLISH', ARGV[2], string.format('%.0f', earliest))
end
return counts.late_finishes
