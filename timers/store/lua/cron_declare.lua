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
-- KEYS[7..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
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
local bad = not_ints('cron_declare', {7, 8, 10, 11})
if bad then return bad end
if ARGV[6] ~= 'keep' and ARGV[6] ~= '0' and ARGV[6] ~= '1' then
  return redis.error_reply('ERR timers cron_declare: bad paused value')
end
local def = redis.call('HGET', KEYS[1], ARGV[3])
local raw = redis.call('HGET', KEYS[2], ARGV[3])
local state = state_read(raw)
if not state then  -- none, or unreadable
  state = {v = '0', last = '0', prev = '0', paused = '0', run = '', anchor = '0'}
elseif def == ARGV[4] and ARGV[6] == 'keep' then
  local pending = redis.call('HEXISTS', KEYS[4], occurrence(ARGV[3], state.last)) == 1
  return {0, tonumber(state.v), pending and tonumber(state.last) or -1}
end
if (raw or '') ~= ARGV[5] then return {-1, 0, -1} end
-- declare {
if state.last ~= '0' then need_withdraw(ARGV[1], KEYS[4], occurrence(ARGV[3], state.last)) end
for _, due_text in ipairs({ARGV[10], ARGV[11]}) do
  if due_text ~= '-1' then  -- the occurrence pended, and one pending under its id
    local id = occurrence(ARGV[3], due_text)
    local old = redis.call('HGET', KEYS[4], id)
    if old then need_timer(ARGV[1], id, old) end
    need_timer(ARGV[1], id, ARGV[9])
  end
end
local asked = keys_asked()
if asked then return asked end
-- declare }

local now = redis_now()
if ARGV[6] ~= 'keep' then state.paused = ARGV[6] end
local withdrawn = state.last ~= '0' and
  withdraw(KEYS[3], KEYS[4], ARGV[1], occurrence(ARGV[3], state.last)) ~= false
if withdrawn then unpark(ARGV[1], occurrence(ARGV[3], state.last)) end

local scheduled = -1
if state.paused == '0' then
  local due_text, key = ARGV[11], KEYS[6]
  if withdrawn then due_text, key = ARGV[10], KEYS[5] end
  local due = tonumber(due_text)
  if due ~= -1 then
    pend(KEYS[3], KEYS[4], ARGV[1], occurrence(ARGV[3], due_text), ARGV[9], due, now, key)
    wake(ARGV[2])
    if not withdrawn then state.prev = state.last end
    state.last = due_text
    scheduled = due
  end
elseif withdrawn then
  state.last = state.prev
end

redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
state.v, state.anchor = ARGV[7], ARGV[8]
state_write(KEYS[2], ARGV[3], state)
return {1, tonumber(ARGV[7]), scheduled}
