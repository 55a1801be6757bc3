#!lua
-- arrive.lua: a timer moving into this shard from another (docs/state-machine.md, "Cluster",
-- T24 to T26; timers/listener/flow/placer.py). Cross-shard atomicity does not exist, so a move
-- is four steps, each atomic in one shard: the copy arrives here inert ("a": it runs from
-- no index), the source shard drops its run and notes the move (depart.lua "d": the one
-- commit point), then the copy is settled here ("c": pended, or discarded when the source
-- did not commit), and depart.lua "k" forgets the note. An arrival left unsettled past its
-- deadline (its listener died or stalled) is settled by any listener from the source's
-- facts (depart.lua "q"): committed, still held (the deadline moves on), or neither, which
-- is final (a run token, once gone, never comes back).
--
-- KEYS[1]  arrivals: zset, "<from shard>|<run token>" -> deadline ms
-- KEYS[2]  arrival records: hash, "<from shard>|<run token>" -> "<due>|<id>:<record>"
-- KEYS[3..] per arrival, "c" only (none for "a"), two each in ARGV order: the due index its
--          record names and its expiring key ("<prefix>:<id>:<record>")
-- KEYS[..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  mode: "a" (arrive) or "c" (settle)
-- ARGV[2]  timer key start "<prefix>:"
-- ARGV[3]  wake channel
-- ARGV[4]  lease ms: an arrival's deadline is now + lease ("a", and "x" below)
-- ARGV[5..] "a": four per arrival: name "<from shard>|<token>", due ms, escaped id, record
--          (the record as it is to be pended here: it says where it came from, ";sh=")
--          "c": two per arrival: name, and "c" (commit: pend it, replacing a timer pending
--          under its id as schedule's "r" does), "d" (discard) or "x" (not settled yet:
--          the deadline moves on)
--
-- An arrival is written once: "a" again for the same name changes nothing. Settling one
-- that is gone (settled already) does nothing. Arguments are checked before any write.
-- Returns per arrival: "a": 1 written, 0 there already; "c": 1 done, 0 gone.
local mode, key_start = ARGV[1], ARGV[2]
local lease = tonumber(ARGV[4])
local per = (mode == 'a') and 4 or 2
if (mode ~= 'a' and mode ~= 'c') or not is_count(ARGV[4]) or (#ARGV - 4) % per ~= 0 then
  return redis.error_reply('ERR timers arrive: bad arguments')
end
local n = (#ARGV - 4) / per
for i = 1, n do
  local base = 4 + (i - 1) * per
  if not string.match(ARGV[base + 1], '^%d+|%d+$') then
    return redis.error_reply('ERR timers arrive: bad arrival name ' .. ARGV[base + 1])
  end
  if mode == 'a' and (not is_int(ARGV[base + 2]) or ARGV[base + 3] == ''
      or string.find(ARGV[base + 3], ':', 1, true)
      or not string.find(ARGV[base + 4], ':', 1, true)) then
    return redis.error_reply('ERR timers arrive: bad arrival ' .. ARGV[base + 1])
  end
  if mode == 'c' and not string.match(ARGV[base + 2], '^[cdx]$') then
    return redis.error_reply('ERR timers arrive: bad verdict for ' .. ARGV[base + 1])
  end
end
if mode == 'c' and #KEYS < 2 + 2 * n then
  return redis.error_reply('ERR timers arrive: two keys per arrival')
end
-- declare {
if mode == 'c' then  -- each arrival pended: its keys, and those of a timer it replaces
  local records = sys_key(key_start, 'rec')
  for i = 1, n do
    local base = 4 + (i - 1) * per
    local payload = ARGV[base + 2] == 'c' and redis.call('HGET', KEYS[2], ARGV[base + 1])
    local _, id, record = string.match(payload or '', '^(%-?%d+)|([^:]+):(.*)$')
    if id and need(records) then
      need_timer(key_start, id, record)
      local old = redis.call('HGET', records, id)
      if old then
        need_timer(key_start, id, old)
        need_unpark(key_start, id)
      end
    end
  end
end
local asked = keys_asked()
if asked then return asked end
-- declare }
local now = redis_now()
local deadline = string.format('%.0f', now + lease)
local out = {}
for i = 1, n do
  local base = 4 + (i - 1) * per
  local name = ARGV[base + 1]
  if mode == 'a' then
    if redis.call('HEXISTS', KEYS[2], name) == 1 then
      out[i] = 0
    else
      redis.call('HSET', KEYS[2], name, ARGV[base + 2] .. '|' .. ARGV[base + 3] .. ':'
        .. ARGV[base + 4])
      redis.call('ZADD', KEYS[1], deadline, name)
      out[i] = 1
    end
  else
    local verdict = ARGV[base + 2]
    local payload = redis.call('HGET', KEYS[2], name)
    if not payload then
      out[i] = 0
    elseif verdict == 'x' then
      redis.call('ZADD', KEYS[1], 'XX', deadline, name)
      out[i] = 1
    else
      redis.call('HDEL', KEYS[2], name)
      redis.call('ZREM', KEYS[1], name)
      if verdict == 'c' then
        local due, id, record = string.match(payload, '^(%-?%d+)|([^:]+):(.*)$')
        local records = sys_key(key_start, 'rec')
        local old = redis.call('HGET', records, id)
        if old then unpark(key_start, id) end
        pend(sys_key(key_start, 'due'), records, key_start, id, record, tonumber(due), now,
          KEYS[2 + 2 * i], old or false)
      end
      out[i] = 1
    end
  end
end
wake(ARGV[3])
return out
