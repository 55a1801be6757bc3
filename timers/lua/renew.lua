#!lua flags=allow-oom
-- renew.lua: extend the leases of runs a listener is still working on.
--
-- KEYS[1]  running: zset, run token -> lease deadline ms
-- ARGV[1]  lease ms (an integer)
-- ARGV[2..] run tokens
--
-- allow-oom: it only updates entries that exist, so it runs on a full server (a refused
-- renewal would let the lease lapse and the timer run twice). A token that is gone was
-- recovered by another listener after its lease lapsed (this listener stalled): it is
-- not revived.
-- Returns the tokens that are gone.
if not is_count(ARGV[1]) then return redis.error_reply('ERR timers renew: bad lease ms') end
local lease_until = string.format('%.0f', redis_now() + tonumber(ARGV[1]))
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZADD', KEYS[1], 'XX', 'CH', lease_until, ARGV[i]) == 0
      and not redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
