#!lua
-- claim.lua: take due timers for one listener to run, each under a lease.
-- State machine: docs/state-machine.md (transitions T4, T5).
--
-- KEYS[1]  due index: zset, escaped id -> due ms
-- KEYS[2]  records: hash, escaped id -> record
-- KEYS[3]  running: zset, run token -> lease deadline ms
-- KEYS[4]  running records: hash, run token -> "reruns@<listener>|due|<id>:<record>",
--          <listener> the id of the listener that claimed the run
-- KEYS[5]  sequence: counter that numbers run tokens
-- KEYS[6]  stats: hash of counters
-- KEYS[7..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  limit: the most timers to claim
-- ARGV[3]  lease ms
-- ARGV[4]  horizon ms: also claim timers due within this long from now (the listener
--          holds them and starts each exactly at its due time)
-- ARGV[5]  the claiming listener's id (no '|'), kept in the run's record so the listener
--          that takes the run over after its lease lapsed can name the one that died
-- ARGV[6]  the groups the listener serves, joined by "," (each [A-Za-z0-9_.-]+)
-- ARGV[7]  the keyed tasks of its package (a concurrency key or cap), joined by ",": each
--          claimed timer of one of those, or with a key of its own (";k="), is noted as
--          claimed and not gated yet (flow.lua's order barrier)
-- ARGV[8..] escaped ids named by expired events: claimed first, when due
--
-- Only timers of the served groups are claimed: those of the plain due index and running
-- set for "default", and "P|due|<group>|<priority>" / "P|run|<group>" for the others
-- (the queues set "P|queues" lists which exist; prelude.lua). Among due timers, higher
-- priority goes first; timers due within the horizon follow, earliest first.
-- Claims, in this order and up to the limit: the named ids that are due; runs whose lease
-- lapsed (their listener died or was paused past its lease: they run again with reruns + 1
-- under a new token, so the old listener can no longer finish them or start anything it
-- was handed along with them, and a slot of a concurrency key the cut run held passes to
-- the rerun, which goes first; flow.lua's transfer_slot); then the earliest due timers. Whoever calls
-- this first wins a timer; everyone else no longer sees it. A claimed timer's key is
-- deleted (it is named by the stored record, so built here from ARGV[1]): it will not
-- expire later and send listeners an event for a timer already taken.
-- No allow-oom flag: claims need memory, so a full server refuses the call before it
-- starts (the listener retries later). Limit, lease and horizon are checked before any
-- write.
-- Returns {now_us, next_due or -1, next_lease or -1, then per claim: token, run, source}
-- (next_due and next_lease over the served groups)
-- where source is "e" (event), "s" (sweep) or "r@<listener>" (recovered lease: the listener
-- that held it and died). A recovered run counts one more crash in its reruns: the listener
-- ends it as failed, not run, once its task's crash limit is reached.
for i = 2, 4 do
  if not is_count(ARGV[i]) then
    return redis.error_reply('ERR timers claim: bad limit, lease or horizon')
  end
end
local now, now_us = redis_now()
local limit = tonumber(ARGV[2])
local lease_until = string.format('%.0f', now + tonumber(ARGV[3]))
local horizon = now + tonumber(ARGV[4])
local out = {now_us, -1, -1}
local claimed = 0
local me = '@' .. string.gsub(ARGV[5] or '', '|', '_')
local served = {}
for group in string.gmatch(ARGV[6] or '', '[^,]+') do served[group] = true end
local keyed = {}
for task in string.gmatch(ARGV[7] or '', '[^,]+') do keyed[task] = true end
local any_keyed = next(keyed) ~= nil

local function start(run, source, group)
  local token = string.format('%.0f', redis.call('INCR', KEYS[5]))
  redis.call('ZADD', running_key_for(KEYS[3], group), lease_until, token)
  redis.call('HSET', KEYS[4], token, run)
  out[#out + 1] = token
  out[#out + 1] = run
  out[#out + 1] = source
  claimed = claimed + 1
  if any_keyed or string.find(run, ';k=', 1, true) then
    local _, _, due, id, record = run_read(run)
    if record and (keyed[record_task(record)] or record_option(record, 'k')) then
      note_ungated(ARGV[1], id, token, record,
        tonumber(record_option(record, 'w') or due) or 0)
    end
  end
  return token
end

local function take(id, due_text, source)
  local record = withdraw(KEYS[1], KEYS[2], ARGV[1], id)
  if record then
    -- a timer promoted from a key's queue sits at score 0 (claimed first): its run is due
    -- at the due time it had (";w="), so its listener waits if that has not come yet
    local waited_from = tonumber(record_option(record, 'w') or '')
    if waited_from and waited_from > tonumber(due_text) then
      due_text = string.format('%.0f', waited_from)
    end
    start(record_reruns(record) .. me .. '|' .. due_text .. '|' .. id .. ':' .. record, source,
      record_group(record))
  end
end

local function claim_named()
  for i = 8, #ARGV do
    if claimed >= limit then return end
    local record = redis.call('HGET', KEYS[2], ARGV[i])
    if record and served[record_group(record)] then
      local score = redis.call('ZSCORE', (due_key_for(KEYS[1], record)), ARGV[i])
      if score and tonumber(score) <= horizon then
        take(ARGV[i], string.format('%.0f', tonumber(score)), 'e')
      end
    end
  end
end

local function recover_lapsed(running)
  if claimed >= limit then return end
  local lapsed = redis.call('ZRANGEBYSCORE', running, '-inf', now, 'LIMIT', 0, limit - claimed)
  for _, token in ipairs(lapsed) do
    local run = redis.call('HGET', KEYS[4], token)
    redis.call('ZREM', running, token)
    redis.call('HDEL', KEYS[4], token)
    local reruns, held_by, rest = string.match(run or '', '^(%d+)@?([^|]*)|(.*)$')
    if reruns then
      redis.call('HINCRBY', KEYS[6], 'reruns', 1)
      local record = string.match(rest, '^[^|]*|[^:]*:(.*)$') or ''
      local rerun = start((tonumber(reruns) + 1) .. me .. '|' .. rest, 'r@' .. held_by,
        record_group(record))
      -- the rerun keeps the key slot the cut run held: it goes before the key's next
      if not transfer_slot(ARGV[1], token, rerun, lease_until) then
        release_slot(ARGV[1], token, now)
      end
    else
      release_slot(ARGV[1], token, now)
      if run then
        redis.log(redis.LOG_WARNING, 'timers: unreadable run record dropped: ' .. token)
      end
    end
  end
end

-- Claim from one due index the timers due in (low, high], earliest first.
local function claim_due(index, low, high)
  if claimed >= limit then return end
  local due = redis.call('ZRANGEBYSCORE', index, low, high, 'WITHSCORES',
    'LIMIT', 0, limit - claimed)
  for i = 1, #due, 2 do
    local before = claimed
    take(due[i], due[i + 1], 's')
    if claimed == before then redis.call('ZREM', index, due[i]) end  -- no record
  end
end

claim_named()
for group in pairs(served) do recover_lapsed(running_key_for(KEYS[3], group)) end
local indexes = served_due_indexes(KEYS[1], ARGV[1], served)
local now_text, horizon_text = string.format('%.0f', now), string.format('%.0f', horizon)
if #indexes == 1 then  -- one due index: one range, as before there were groups
  claim_due(indexes[1][1], '-inf', horizon_text)
else
  for _, index in ipairs(indexes) do claim_due(index[1], '-inf', now_text) end
  for _, index in ipairs(indexes) do claim_due(index[1], '(' .. now_text, horizon_text) end
end

local next_due, next_lease
for _, index in ipairs(indexes) do
  local head = head_due(index[1])
  if head and (not next_due or head < next_due) then next_due = head end
  if not head and index[3] then redis.call('SREM', sys_key(ARGV[1], 'queues'), index[3]) end
end
for group in pairs(served) do
  local head = head_due(running_key_for(KEYS[3], group))
  if head and (not next_lease or head < next_lease) then next_lease = head end
end
out[2] = next_due or -1
out[3] = next_lease or -1
return out
