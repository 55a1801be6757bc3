#!lua flags=allow-oom
-- renew.lua: extend the leases of runs a listener is still working on.
--
-- KEYS[1]  running: zset, run token -> lease deadline ms
-- ARGV[1]  lease ms
-- ARGV[2..] run tokens
--
-- A token that is gone was recovered by another listener after its lease lapsed (this
-- listener stalled): it is not revived.
-- Returns the tokens that are gone.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = string.format('%.0f', now + tonumber(ARGV[1]))
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', lease_until, ARGV[i]) == 0
      and not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
