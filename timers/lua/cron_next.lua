#!lua flags=allow-oom
-- cron_next.lua: one step of a recurrence around a run of one of its occurrences:
-- schedule the next occurrence (at most once, ever), and take or release the overlap slot.
--
-- KEYS[1]  recurrence states: hash, escaped name -> "v|last|prev|paused|run|anchor"
-- KEYS[2]  due index: zset, escaped id -> due ms
-- KEYS[3]  records: hash, escaped id -> record
-- KEYS[4]  running: zset, run token -> lease deadline ms
-- KEYS[5]  the expiring key of the next occurrence (only when ARGV[6] is not -1)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  escaped name
-- ARGV[4]  version of the definition the running occurrence was scheduled under
-- ARGV[5]  due ms of the running occurrence
-- ARGV[6]  due ms of the next occurrence, or -1 to schedule none in this call
-- ARGV[7]  record of the next occurrence
-- ARGV[8]  "1": schedule it only if the slot take below fails (the caller schedules it
--          when its run has ended); "0": schedule it now
-- ARGV[9]  run token that takes the overlap slot, or ""
-- ARGV[10] run token that releases the overlap slot, or ""
--
-- The next occurrence (id "<name>@<due>") is scheduled only when the state still names
-- the running occurrence as the latest one (last == ARGV[5]) under the same version, and
-- only later than it: a rerun, a second listener or a change made meanwhile finds last
-- moved on and schedules nothing. The slot is taken unless another run holds it under a
-- live lease (a finished run, or one whose listener died, no longer blocks).
-- allow-oom: it runs around a run already claimed, and the occurrence it adds takes the
-- place of the one that was claimed: refused, the run would be handed back and run twice.
-- Numbers are checked before the first write; the wake is a PUBLISH by pcall.
-- Returns {status, holder}: status "ok", "gone" (no such recurrence), "stale" (the
-- definition changed since) or "paused", which change nothing; holder is the token of
-- the run in progress that kept the slot, or "".
for _, i in ipairs({5, 6}) do
  if not string.match(ARGV[i] or '', '^%-?%d+$') then
    return redis.error_reply('ERR timers cron_next: ARGV[' .. i .. '] is not an integer')
  end
end
local raw = redis.call('HGET', KEYS[1], ARGV[3])
if not raw then return {'gone', ''} end
local v, last, prev, paused, run, anchor =
  string.match(raw, '^(%d+)|(%-?%d+)|(%-?%d+)|([01])|([^|]*)|(%-?%d+)$')
if not v then return {'gone', ''} end
if v ~= ARGV[4] then return {'stale', ''} end
if paused == '1' then return {'paused', ''} end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local changed = false
local holder = ''

if ARGV[9] ~= '' then
  local lease = run ~= '' and run ~= ARGV[9] and redis.call('ZSCORE', KEYS[4], run)
  if lease and tonumber(lease) > now then
    holder = run
  elseif run ~= ARGV[9] then
    run = ARGV[9]
    changed = true
  end
end
if ARGV[10] ~= '' and run == ARGV[10] then
  run = ''
  changed = true
end

local due = tonumber(ARGV[6])
local now_or_never = ARGV[8] ~= '1' or holder ~= ''
if due ~= -1 and now_or_never and tonumber(last) == tonumber(ARGV[5])
    and due > tonumber(last) then
  local id = ARGV[3] .. '@' .. ARGV[6]
  local record = ARGV[7]
  local old = redis.call('HGET', KEYS[3], id)
  if old and old ~= record then redis.call('DEL', ARGV[1] .. id .. ':' .. old) end
  redis.call('HSET', KEYS[3], id, record)
  if due > now then
    redis.call('SET', KEYS[5], '1', 'PXAT', ARGV[6])
  end
  local head = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  redis.call('ZADD', KEYS[2], ARGV[6], id)
  if not head[2] or due < tonumber(head[2]) then
    redis.pcall('PUBLISH', ARGV[2], ARGV[6])
  end
  prev, last = last, ARGV[6]
  changed = true
end

if changed then
  redis.call('HSET', KEYS[1], ARGV[3],
    table.concat({v, last, prev, paused, run, anchor}, '|'))
end
return {'ok', holder}
