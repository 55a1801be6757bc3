-- schedule.lua: add timers, or replace pending timers that have the same id.
--
-- KEYS[1]    due index: zset, escaped id -> due ms (Redis clock)
-- KEYS[2]    records: hash, escaped id -> record "task[;opts]:args"
-- KEYS[2+i]  the new expiring key of timer i ("<prefix>:<id>:<record>")
-- ARGV[1]    timer key start "<prefix>:"
-- ARGV[2]    wake channel
-- ARGV[3..]  five values per timer i, in the order of KEYS[2+i]: escaped id, record,
--            mode ("in": ms from now | "at": epoch ms), ms, and "r" to replace a pending
--            timer with the same id or "n" to refuse it (generated ids must be new)
--
-- The previous key of a replaced timer is named by its stored record, which the caller
-- cannot know without a read; it is built here from ARGV[1] (same prefix, so the same
-- hash tag). The due time comes from Redis TIME, never from a client clock. A timer due
-- now or earlier gets no expiring key: the wake below makes a sweeper fire it at once.
-- Returns {now_ms, due_1, ..., due_n}; due_i is nil where "n" refused an id that is
-- pending with another record (the same record means this very call was retried: its
-- due time is returned).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local head_due = head[2] and tonumber(head[2])
local earliest
local out = {now}
for i = 1, #KEYS - 2 do
  local base = 2 + (i - 1) * 5
  local id, record, mode = ARGV[base + 1], ARGV[base + 2], ARGV[base + 3]
  local due = tonumber(ARGV[base + 4])
  if mode == 'in' then due = now + due end
  local key = KEYS[2 + i]
  local old = redis.call('HGET', KEYS[2], id)
  if old and ARGV[base + 5] == 'n' then
    if old == record then
      out[#out + 1] = tonumber(redis.call('ZSCORE', KEYS[1], id))
    else
      out[#out + 1] = false
    end
  else
    if old and old ~= record then
      redis.call('DEL', ARGV[1] .. id .. ':' .. old)
      redis.call('HSET', KEYS[2], id, record)
    elseif not old then
      redis.call('HSET', KEYS[2], id, record)
    end
    local due_text = string.format('%.0f', due)
    if due > now then
      redis.call('SET', key, '1', 'PXAT', due_text)
    elseif old == record then
      redis.call('DEL', key)
    end
    redis.call('ZADD', KEYS[1], due_text, id)
    if not earliest or due < earliest then earliest = due end
    out[#out + 1] = due
  end
end
if earliest and (not head_due or earliest < head_due) then
  redis.call('PUBLISH', ARGV[2], string.format('%.0f', earliest))
end
return out
