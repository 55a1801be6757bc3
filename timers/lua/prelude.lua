-- prelude.lua: helpers shared by every script. timers/scripts.py puts this text right
-- after each script's "#!lua ..." shebang line when it loads the script; a script's own
-- header (its KEYS and ARGV) follows it.
--
-- A timer is three things (see timers/keys.py): an entry in the due index (escaped id ->
-- due ms), its record (escaped id -> record) and, while it is due later than now, its
-- expiring key "<prefix>:<id>:<record>". That key is named by the stored record, so the
-- helpers build it from the timer key start "<prefix>:" (same prefix, same hash tag).

-- Redis time: now in ms, and in µs.
local function redis_now()
  local t = redis.call('TIME')
  local s, us = tonumber(t[1]), tonumber(t[2])
  return s * 1000 + math.floor(us / 1000), s * 1000000 + us
end

-- Whether a value is an integer (is_int) or an integer of 0 or more (is_count).
local function is_int(value)
  return string.match(value or '', '^%-?%d+$') ~= nil
end

local function is_count(value)
  return string.match(value or '', '^%d+$') ~= nil
end

-- An error reply naming the first of ARGV[i], i in indexes, that is not an integer, or
-- nil: a script checks its numbers before its first write.
local function not_ints(script, indexes)
  for _, i in ipairs(indexes) do
    if not is_int(ARGV[i]) then
      return redis.error_reply('ERR timers ' .. script .. ': ARGV[' .. i ..
        '] is not an integer')
    end
  end
  return nil
end

-- The due ms at the head of a due index, or nil when it is empty.
local function head_due(due_key)
  local head = redis.call('ZRANGE', due_key, 0, 0, 'WITHSCORES')
  return head[2] and tonumber(head[2])
end

-- Wake the listeners when a timer due at `due` is earlier than the head read before it
-- was added. A PUBLISH by pcall: a user who may not publish still writes.
local function wake_if_first(channel, due, head)
  if due and (not head or due < head) then
    redis.pcall('PUBLISH', channel, string.format('%.0f', due))
  end
end

-- Withdraw a pending timer: out of the due index and records, its expiring key deleted.
-- Returns its record, or false when it was not pending.
local function withdraw(due_key, records_key, key_start, id)
  local record = redis.call('HGET', records_key, id)
  if not record then return false end
  redis.call('ZREM', due_key, id)
  redis.call('HDEL', records_key, id)
  redis.call('DEL', key_start .. id .. ':' .. record)
  return record
end

-- Pend a timer: `record` under `id`, due at `due` ms (replacing another record pending
-- under that id, whose key goes), with its expiring key `key` (default: built from
-- key_start) set when it is due later than now. The caller wakes (wake_if_first).
local function pend(due_key, records_key, key_start, id, record, due, now, key)
  local old = redis.call('HGET', records_key, id)
  if old ~= record then
    if old then redis.call('DEL', key_start .. id .. ':' .. old) end
    redis.call('HSET', records_key, id, record)
  end
  key = key or (key_start .. id .. ':' .. record)
  local due_text = string.format('%.0f', due)
  if due > now then
    redis.call('SET', key, '1', 'PXAT', due_text)
  elseif old == record then
    redis.call('DEL', key)
  end
  redis.call('ZADD', due_key, due_text, id)
end

-- A recurrence state "v|last|prev|paused|run|anchor" (timers/cron/state.py reads the same
-- format): a table of its six fields as text, or nil when missing or unreadable.
local function state_read(raw)
  if not raw then return nil end
  local v, last, prev, paused, run, anchor =
    string.match(raw, '^(%d+)|(%-?%d+)|(%-?%d+)|([01])|([^|]*)|(%-?%d+)$')
  if not v then return nil end
  return {v = v, last = last, prev = prev, paused = paused, run = run, anchor = anchor}
end

local function state_write(states_key, name, s)
  redis.call('HSET', states_key, name,
    table.concat({s.v, s.last, s.prev, s.paused, s.run, s.anchor}, '|'))
end

-- The pending occurrence of recurrence `name` (escaped) due at `due` (text).
local function occurrence(name, due)
  return name .. '@' .. due
end
