#!lua flags=allow-oom
-- reschedule.lua: move a pending timer to a new due time; its id, task and args stay.
--
-- KEYS[1]  due index: zset, escaped id -> due ms
-- KEYS[2]  records: hash, escaped id -> record
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  escaped id
-- ARGV[4]  mode: "in" (ms from now) | "at" (epoch ms, 0 or later)
-- ARGV[5]  ms (an integer)
--
-- allow-oom: it changes a timer in place (same key, same entries), so it runs on a full
-- server. Its arguments are checked before the first write; an "in" due time before 1970
-- counts as 0. The timer's key is named by its stored record, so it is built here from
-- ARGV[1]. The wake is a PUBLISH by pcall: a user who may not publish still reschedules.
-- Returns the new due ms, or nil when the id is not pending.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = string.match(ARGV[5] or '', '^%-?%d+$') and tonumber(ARGV[5])
if not due or (ARGV[4] ~= 'in' and ARGV[4] ~= 'at') or ARGV[3] == ''
    or string.find(ARGV[3], ':', 1, true) then
  return redis.error_reply('ERR timers reschedule: bad arguments')
end
if ARGV[4] == 'in' then due = math.max(now + due, 0) end
if due < 0 then return redis.error_reply('ERR timers reschedule: due time before 1970') end
local record = redis.call('HGET', KEYS[2], ARGV[3])
if not record then return false end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local key = ARGV[1] .. ARGV[3] .. ':' .. record
local due_text = string.format('%.0f', due)
if due > now then
  redis.call('SET', key, '1', 'PXAT', due_text)
else
  redis.call('DEL', key)
end
redis.call('ZADD', KEYS[1], due_text, ARGV[3])
if not head[2] or due < tonumber(head[2]) then
  redis.pcall('PUBLISH', ARGV[2], due_text)
end
return due
