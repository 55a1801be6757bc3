#!lua flags=allow-oom
-- depart.lua: a claimed run leaves this shard for the shard its limit lives in: the one
-- commit point of a move (docs/state-machine.md, "Cluster", T24 to T26; arrive.lua has
-- the whole protocol). Frees memory or keeps it: runs on a full server.
--
-- KEYS[1]  moves: hash, run token -> the shard it moved to (kept until the arrival is
--          settled there, then forgotten: "k")
-- KEYS[2]  stats: hash of counters ("placed": runs moved to their limit's shard)
-- KEYS[3..] per run, "d" only (none for "q", "k"), in ARGV order: the running set of its
--          group
-- KEYS[..]  shared keys: timers/model/keys.py Keyspace.script_keys (the helpers' keys)
-- ARGV[1]  mode: "d" (depart), "q" (ask what became of runs), "k" (forget moves)
-- ARGV[2]  timer key start "<prefix>:"
-- ARGV[3..] "d": two per run: run token, the shard it moves to; "q", "k": run tokens
--
-- "d": a run still held here (its token in its running set and its run record: a lease
-- that lapsed and that no claim recovered yet is still its own, as in renew.lua) that
-- holds no concurrency key slot (a rerun given its cut run's slot stays) leaves: out of
-- the running set and the run records, off the order barrier (a key it held back is
-- promoted), and the move is noted. Reply per run: 1 left, 0 not held (lost: its lease
-- was recovered, or it ended), 2 holds a slot here (it stays, and runs here).
-- "q": per token, 1 it left (noted), 2 still held here, 0 neither (final: it never
-- leaves any more). "k": forgets the notes; returns how many.
local mode, key_start = ARGV[1], ARGV[2]
if mode ~= 'd' and mode ~= 'q' and mode ~= 'k' then
  return redis.error_reply('ERR timers depart: bad mode')
end
local runrec = sys_key(key_start, 'runrec')
if mode == 'k' then
  if #ARGV < 3 then return 0 end
  return redis.call('HDEL', KEYS[1], unpack(ARGV, 3))
end
if mode == 'q' then
  local out = {}
  for i = 3, #ARGV do
    -- the run record first: a departure in between shows as noted
    if redis.call('HEXISTS', runrec, ARGV[i]) == 1 then
      out[#out + 1] = 2
    elseif redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
  end
  return out
end
local n = (#ARGV - 2) / 2
if n ~= math.floor(n) or #KEYS < 2 + n then
  return redis.error_reply('ERR timers depart: two args and a key per run')
end
for i = 1, n do
  if not is_count(ARGV[1 + 2 * i]) or not is_count(ARGV[2 + 2 * i]) then
    return redis.error_reply('ERR timers depart: bad token or shard')
  end
end
-- declare {
for i = 1, n do  -- each run's order barrier, and the keys it may have held back
  local record = select(5, run_read(redis.call('HGET', runrec, ARGV[1 + 2 * i])))
  if record then need(flow_key(key_start, 'ungated', barrier_of(record))) end
end
need_barred(key_start)
local asked = keys_asked()
if asked then return asked end
-- declare }
local now = redis_now()
local out, left = {}, 0
for i = 1, n do
  local token, to, running = ARGV[1 + 2 * i], ARGV[2 + 2 * i], KEYS[2 + i]
  local run = redis.call('HGET', runrec, token)
  if not run or not redis.call('ZSCORE', running, token) then
    out[i] = 0
  elseif redis.call('HEXISTS', sys_key(key_start, 'held'), token) == 1 then
    out[i] = 2
  else
    redis.call('ZREM', running, token)
    redis.call('HDEL', runrec, token)
    local _, _, _, id, record = run_read(run)
    if id and record then drop_ungated(key_start, id, record) end
    redis.call('HSET', KEYS[1], token, to)
    left = left + 1
    out[i] = 1
  end
end
if left > 0 then
  redis.call('HINCRBY', KEYS[2], 'placed', left)
  promote_barred(key_start, now)  -- a key whose head waited behind those that left
end
return out
