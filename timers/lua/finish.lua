-- finish.lua: end runs: count successes, record failures where the CLI lists them.
--
-- KEYS[1]  running: zset, run token -> lease deadline ms
-- KEYS[2]  running records: hash, run token -> run
-- KEYS[3]  stats: hash of counters
-- KEYS[4]  failures: zset, failure id -> time of failure ms
-- KEYS[5]  failure records: hash, failure id -> JSON
-- ARGV[1]  failure retention ms: older failure records are trimmed, a few per call
-- ARGV[2..] three values per run: token, failure id ("" when the run succeeded),
--           failure JSON ("" when it succeeded)
--
-- A token no longer held (its lease lapsed and another listener took the run over) is
-- counted as a late finish and changes nothing else: the run that holds it now decides.
-- A failure with token "" is a rejected event (no run behind it): it is recorded only
-- where no record with that failure id exists, so it never hides the record of a run.
-- Returns the number of late finishes.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local late = 0
local fired, failed, rejected = 0, 0, 0
for i = 2, #ARGV, 3 do
  local token, failure_id, failure = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local held = token == '' or redis.call('ZREM', KEYS[1], token) == 1
  if token ~= '' then redis.call('HDEL', KEYS[2], token) end
  if not held then
    late = late + 1
  elseif failure_id == '' then
    fired = fired + 1
  elseif token == '' then
    if redis.call('HSETNX', KEYS[5], failure_id, failure) == 1 then
      redis.call('ZADD', KEYS[4], now, failure_id)
      rejected = rejected + 1
    end
  else
    redis.call('ZADD', KEYS[4], now, failure_id)
    redis.call('HSET', KEYS[5], failure_id, failure)
    failed = failed + 1
  end
end
if fired > 0 then redis.call('HINCRBY', KEYS[3], 'fired', fired) end
if rejected > 0 then redis.call('HINCRBY', KEYS[3], 'rejected', rejected) end
if failed > 0 then redis.call('HINCRBY', KEYS[3], 'failed', failed) end
if failed + rejected > 0 then
  local old = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[1]),
    'LIMIT', 0, 2 * (failed + rejected))
  for _, failure_id in ipairs(old) do
    redis.call('ZREM', KEYS[4], failure_id)
    redis.call('HDEL', KEYS[5], failure_id)
  end
end
if late > 0 then redis.call('HINCRBY', KEYS[3], 'late_finishes', late) end
return late
