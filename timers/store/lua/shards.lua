#!lua flags=allow-oom
-- shards.lua: how many shards the timers of a prefix are split into, fixed at first use.
--
-- KEYS[1]  layout: string, the shard count (in the prefix's own slot)
-- KEYS[2]  due index
-- KEYS[3]  records
-- KEYS[4]  recurrence definitions
-- KEYS[5]  failures
-- KEYS[6]  queues
--          (KEYS[2..6] are of the one-shard keyspace of the same prefix: if any exists,
--          the prefix was in use before it had a layout, and stays one shard so none of
--          its timers is stranded)
-- ARGV[1]  the count wanted when none is stored yet: an integer, 1 to 1024, or "auto": one
--          per primary of the cluster that serves slots (CLUSTER INFO's cluster_size)
-- ARGV[2]  "1": store the count (a producer or listener on a cluster); "0": only read
--
-- Returns the count in force. allow-oom: it writes one small key, once per prefix, and a
-- full server must still answer reads that need the layout first.
local wanted = tonumber(ARGV[1])
if ARGV[1] == 'auto' then
  local ok, info = pcall(redis.call, 'CLUSTER', 'INFO')
  wanted = ok and tonumber(string.match(tostring(info), 'cluster_size:(%d+)')) or 1
  wanted = math.min(math.max(wanted, 1), 1024)
end
if not wanted or wanted < 1 or wanted > 1024 or wanted ~= math.floor(wanted) then
  return redis.error_reply('ERR timers shards: bad shard count')
end
local stored = redis.call('GET', KEYS[1])
if stored then
  local count = tonumber(stored)
  if not count or count < 1 or count > 1024 or count ~= math.floor(count) then
    return redis.error_reply('ERR timers shards: ' .. KEYS[1] .. ' holds ' ..
      string.format('%q', string.sub(stored, 1, 40)) ..
      ', not a shard count (1 to 1024): restore it, or delete it if the prefix is empty')
  end
  return count
end
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    wanted = 1
    break
  end
end
if ARGV[2] == '1' then
  redis.call('SET', KEYS[1], wanted)
end
return wanted
