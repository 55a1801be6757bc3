#!lua
-- cron_declare.lua: create or change a recurrence, or resume it, replacing its pending
-- occurrence by the new definition's next one in the same step.
--
-- KEYS[1]  recurrence definitions: hash, escaped name -> definition JSON
-- KEYS[2]  recurrence states: hash, escaped name -> "v|last|prev|paused|run|anchor"
-- KEYS[3]  due index: zset, escaped id -> due ms
-- KEYS[4]  records: hash, escaped id -> record
-- KEYS[5]  expiring key of the next occurrence if the pending one is withdrawn
-- KEYS[6]  expiring key of the next occurrence if none was pending
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  escaped name
-- ARGV[4]  definition JSON
-- ARGV[5]  the state the caller read ("" for none): if it changed, nothing is written
-- ARGV[6]  paused: "keep" (a declaration), "0" (resume)
-- ARGV[7]  new version (the read one + 1)
-- ARGV[8]  anchor ms of an interval (0 for cron)
-- ARGV[9]  record of the next occurrence (it carries the new version)
-- ARGV[10] due ms of the next occurrence if the pending one is withdrawn
-- ARGV[11] due ms of the next occurrence if none was pending (one was claimed, or none)
--
-- The same definition declared again (every process does so at start-up) changes
-- nothing, pending occurrence included. A changed one gets the next version: its pending
-- occurrence (named by the state: "<name>@<last>"; its key built from ARGV[1] and the
-- stored record, as in cancel.lua) is withdrawn and the next occurrence of the new
-- definition scheduled. The caller computed that due time from the state it read, later
-- than the last occurrence a listener has taken (ARGV[10]: the one before the withdrawn
-- one; ARGV[11]: the last), so nothing runs twice; this script picks the one that fits.
-- A paused recurrence keeps no pending occurrence; resuming it schedules one.
-- No allow-oom flag: it may add a timer, so a full server refuses it before it starts.
-- Numbers are checked before the first write; the wake is a PUBLISH by pcall.
-- Returns {result, version, due}: result 0 unchanged, 1 written, -1 the state changed
-- since the caller read it (read again and retry); due is -1 when none is pending.
for _, i in ipairs({7, 8, 10, 11}) do
  if not string.match(ARGV[i] or '', '^%-?%d+$') then
    return redis.error_reply('ERR timers cron_declare: ARGV[' .. i .. '] is not an integer')
  end
end
if ARGV[6] ~= 'keep' and ARGV[6] ~= '0' and ARGV[6] ~= '1' then
  return redis.error_reply('ERR timers cron_declare: bad paused value')
end
local def = redis.call('HGET', KEYS[1], ARGV[3])
local raw = redis.call('HGET', KEYS[2], ARGV[3])
local v, last, prev, paused, run, anchor
if raw then
  v, last, prev, paused, run, anchor =
    string.match(raw, '^(%d+)|(%-?%d+)|(%-?%d+)|([01])|([^|]*)|(%-?%d+)$')
end
if not v then
  v, last, prev, paused, run, anchor = '0', '0', '0', '0', '', '0'  -- none, or unreadable
elseif def == ARGV[4] and ARGV[6] == 'keep' then
  local pending = redis.call('HEXISTS', KEYS[4], ARGV[3] .. '@' .. last) == 1
  return {0, tonumber(v), pending and tonumber(last) or -1}
end
if (raw or '') ~= ARGV[5] then return {-1, 0, -1} end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[6] ~= 'keep' then paused = ARGV[6] end

local withdrawn = false
if last ~= '0' then
  local id = ARGV[3] .. '@' .. last
  local record = redis.call('HGET', KEYS[4], id)
  if record then
    redis.call('ZREM', KEYS[3], id)
    redis.call('HDEL', KEYS[4], id)
    redis.call('DEL', ARGV[1] .. id .. ':' .. record)
    withdrawn = true
  end
end

local scheduled = -1
if paused == '0' then
  local due_text, key = ARGV[11], KEYS[6]
  if withdrawn then due_text, key = ARGV[10], KEYS[5] end
  local due = tonumber(due_text)
  if due ~= -1 then
    local id = ARGV[3] .. '@' .. due_text
    local old = redis.call('HGET', KEYS[4], id)
    if old and old ~= ARGV[9] then redis.call('DEL', ARGV[1] .. id .. ':' .. old) end
    redis.call('HSET', KEYS[4], id, ARGV[9])
    if due > now then redis.call('SET', key, '1', 'PXAT', due_text) end
    local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
    redis.call('ZADD', KEYS[3], due_text, id)
    if not head[2] or due < tonumber(head[2]) then
      redis.pcall('PUBLISH', ARGV[2], due_text)
    end
    if not withdrawn then prev = last end
    last = due_text
    scheduled = due
  end
elseif withdrawn then
  last = prev
end

redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[3],
  table.concat({ARGV[7], last, prev, paused, run, ARGV[8]}, '|'))
return {1, tonumber(ARGV[7]), scheduled}
