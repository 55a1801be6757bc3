-- reschedule.lua: move a pending timer to a new due time; its id, task and args stay.
--
-- KEYS[1]  due index: zset, escaped id -> due ms
-- KEYS[2]  records: hash, escaped id -> record
-- ARGV[1]  timer key start "<prefix>:"
-- ARGV[2]  wake channel
-- ARGV[3]  escaped id
-- ARGV[4]  mode: "in" (ms from now) | "at" (epoch ms)
-- ARGV[5]  ms
--
-- The timer's key is named by its stored record, so it is built here from ARGV[1].
-- Returns the new due ms, or nil when the id is not pending.
local record = redis.call('HGET', KEYS[2], ARGV[3])
if not record then return false end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = tonumber(ARGV[5])
if ARGV[4] == 'in' then due = now + due end
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
  redis.call('PUBLISH', ARGV[2], due_text)
end
return due
