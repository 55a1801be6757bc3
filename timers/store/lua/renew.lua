#!lua flags=allow-oom
-- renew.lua: extend the leases of runs a listener is still working on.
-- State machine: docs/state-machine.md (transitions T19).
--
-- KEYS[1]  running: the plain running zset, run token -> lease deadline ms (a group's
--          runs are in "<it>|<group>", see prelude.lua)
-- KEYS[2]  running records: hash, run token -> "reruns@<listener>|due|<id>:<record>"
-- KEYS[3..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  lease ms (an integer)
-- ARGV[2]  timer key start "<prefix>:"
-- ARGV[3..] run tokens
--
-- allow-oom: it only updates entries that exist, so it runs on a full server (a refused
-- renewal would let the lease lapse and the timer run twice). A token that is gone was
-- recovered by another listener after its lease lapsed (this listener stalled): it is
-- not revived. The slot of a concurrency key a run holds is renewed with its lease.
-- Returns the tokens that are gone.
if not is_count(ARGV[1]) then return redis.error_reply('ERR timers renew: bad lease ms') end
local lease_until = string.format('%.0f', redis_now() + tonumber(ARGV[1]))
local held_key = sys_key(ARGV[2], 'held')
local slots_held = redis.call('EXISTS', held_key) == 1
-- declare {
for i = 3, #ARGV do  -- each run's group's running set, the slot of a key it holds
  need_run(ARGV[2], ARGV[i])
  if slots_held then
    local key = string.match(redis.call('HGET', held_key, ARGV[i]) or '', '^%d+|%d+|(.+)$')
    if key then need(flow_key(ARGV[2], 'slots', key)) end
  end
end
local asked = keys_asked()
if asked then return asked end
-- declare }

-- Whether the run is still leased (in its group's running set), its lease extended.
local function extend(token)
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', lease_until, token) == 1
      or redis.call('ZSCORE', KEYS[1], token) then
    return true
  end
  local record = select(5, run_read(redis.call('HGET', KEYS[2], token)))
  local group = record and record_group(record) or DEFAULT_GROUP
  if group == DEFAULT_GROUP then return false end
  local running = running_key_for(KEYS[1], group)
  return redis.call('ZADD', running, 'XX', 'CH', lease_until, token) == 1
    or redis.call('ZSCORE', running, token) ~= false
end

local lost = {}
for i = 3, #ARGV do
  if not extend(ARGV[i]) then
    lost[#lost + 1] = ARGV[i]
  elseif slots_held then
    local key = string.match(redis.call('HGET', held_key, ARGV[i]) or '', '^%d+|%d+|(.+)$')
    if key then
      redis.call('ZADD', flow_key(ARGV[2], 'slots', key), 'XX', lease_until, ARGV[i])
    end
  end
end
return lost
