#!lua flags=allow-oom
-- trim.lua: one bounded step of the run history's upkeep (history.lua's history_plan):
-- drop records past their expiry, else records over the count (oldest first), else index
-- records written before the index existed. Each listener calls it in a loop, idle or not
-- (timers/listener/endings/history.py HistoryTrimmer): again after a short pause while a step
-- says more is owed, so no call holds Redis long and a lowered bound is reached soon.
-- Atomic and idempotent: listeners trimming one history at once each take what is left.
-- State machine: docs/state-machine.md (the history row; no transition reads it).
--
-- KEYS[1]  history: zset, batch id -> end ms (history.lua)
-- KEYS[2]  history expiry: zset, batch id -> when its records expire, ms
-- KEYS[3]  history records: hash, escaped id -> "<batch id>|<record>"
-- KEYS[4]  history batches: hash, batch id -> the escaped ids it wrote
-- KEYS[5]  history dead ends: zset, escaped id -> end ms
-- KEYS[6]  index cursor: string, the end ms through which every batch is indexed
-- ARGV[1]  count: the most records kept (the calling listener's --history-count)
-- ARGV[2]  budget: about how many records one call drops or indexes
--
-- Returns {records dropped or indexed, 1 if more is owed now else 0, 1 if the history is
-- empty (nothing to drop until someone writes) else 0}.
if not is_count(ARGV[1]) or not is_count(ARGV[2]) or tonumber(ARGV[2]) < 1 then
  return redis.error_reply('ERR timers trim: bad arguments')
end
local count, budget = tonumber(ARGV[1]), tonumber(ARGV[2])
local now = redis_now()
local plan = history_plan(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], now, count, budget)
-- declare {
if plan then
  for task in pairs(plan.tasks) do need(history_task_key(KEYS[1], task)) end
end
local asked = keys_asked()
if asked then return asked end
-- declare }
local done, more = 0, 0
if plan then
  done = history_upkeep(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6], plan)
  if plan.more then more = 1 end
end
local empty = 0
if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('HLEN', KEYS[3]) == 0 then empty = 1 end
return {done, more, empty}
