#!lua flags=allow-oom
-- cron_next.lua: one step of a recurrence around a run of one of its occurrences:
-- schedule the next occurrence (at most once, ever), and take or release the overlap slot.
--
-- KEYS[1]  recurrence states: hash, escaped name -> "v|last|prev|paused|run|anchor"
-- KEYS[2]  due index: zset, escaped id -> due ms
-- KEYS[3]  records: hash, escaped id -> record
-- KEYS[4]  running: zset, run token -> lease deadline ms, of the running occurrence's
--          group (a group's runs are leased in "<running>|<group>", see prelude.lua)
-- KEYS[5]  the expiring key of the next occurrence (only when ARGV[6] is not -1)
-- KEYS[5 or 6..] shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
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
local bad = not_ints('cron_next', {5, 6})
if bad then return bad end
local state = state_read(redis.call('HGET', KEYS[1], ARGV[3]))
if not state then return {'gone', ''} end
if state.v ~= ARGV[4] then return {'stale', ''} end
if state.paused == '1' then return {'paused', ''} end
-- declare {
if tonumber(ARGV[6]) ~= -1 then  -- the next occurrence's due index; one pending under its id
  local id = occurrence(ARGV[3], ARGV[6])
  need((due_key_for(KEYS[2], ARGV[7])))
  local old = redis.call('HGET', KEYS[3], id)
  if old then need_timer(ARGV[1], id, old) end
end
local asked = keys_asked()
if asked then return asked end
-- declare }

local now = redis_now()
local run, last = state.run, state.last
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
  pend(KEYS[2], KEYS[3], ARGV[1], occurrence(ARGV[3], ARGV[6]), ARGV[7], due, now, KEYS[5])
  wake(ARGV[2])
  state.prev, state.last = last, ARGV[6]
  changed = true
end

if changed then
  state.run = run
  state_write(KEYS[1], ARGV[3], state)
end
return {'ok', holder}
