-- cancel: a pending or scheduled task never runs; a running one is asked to stop.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] pending list         blueque_pending_tasks_[queue]
-- KEYS[3] scheduled zset       blueque_scheduled_tasks_[queue]
-- KEYS[4] cancelled list       blueque_cancelled_tasks_[queue]
-- KEYS[5] outcomes this minute blueque_finished_per_minute_[queue]_[minute]
-- KEYS[6] outcomes ever        blueque_outcome_counts_[queue]
-- KEYS[7] outcomes this hour   blueque_finished_per_hour_[queue]_[hour] (kept 691200 s)
-- ARGV[1] task id, ARGV[2] now, ARGV[3] error text recorded for the cancelled task,
-- ARGV[4] seconds KEYS[5] is kept, ARGV[5] the queue's done channel (waiters are woken)
-- Returns {'cancelled', previous status} when the task is now failed and will never run, or
-- {'requested', node} when it is running: its listener (told on blueque_control_[node]) stops
-- it and records the failure. Error "BLUEQUE_STATE ..." for a finished task, except a task
-- this very call cancelled on an earlier try whose reply was lost (its `cancelled` field is
-- ARGV[2]): {'cancelled', 'failed'} again.
-- A cancelled task is failed, stamped `cancelled`, listed in KEYS[4] (not in the failed
-- list), counted `cancelled`, its `eta` removed and the cancel added to its `history`
-- (PROTOCOL.md 3.2): what cancel_pending.lua and cancel_scheduled.lua write for each task too.
local function count_outcome(outcome)  -- the outcome counters (PROTOCOL.md 5.6)
  redis.call('HINCRBY', KEYS[5], outcome, 1)
  redis.call('EXPIRE', KEYS[5], ARGV[4])
  redis.call('HINCRBY', KEYS[6], outcome, 1)
  redis.call('HINCRBY', KEYS[7], outcome, 1)
  redis.call('EXPIRE', KEYS[7], 691200)  -- keys.FINISHED_HOUR_TTL
end
local function cut(text)  -- an error as the history keeps it: 500 bytes, whole characters
  if #text <= 500 then
    return text
  end
  local n = 500
  while n > 0 and string.byte(text, n + 1) >= 128 and string.byte(text, n + 1) < 192 do
    n = n - 1
  end
  return string.sub(text, 1, n) .. '...'
end
local function remember(entry)  -- the history: one JSON entry per ending, the last 20
  local ok, old = pcall(cjson.decode, redis.call('HGET', KEYS[1], 'history') or '[]')
  local list = {}
  if ok and type(old) == 'table' then
    for i = 1, #old do
      list[i] = old[i]
    end
  end
  list[#list + 1] = entry
  while #list > 20 do
    table.remove(list, 1)
  end
  redis.call('HSET', KEYS[1], 'history', cjson.encode(list))
end
local cur = redis.call('HMGET', KEYS[1], 'status', 'node', 'attempts')
local status = cur[1]
if not status then
  return redis.error_reply('BLUEQUE_MISSING task ' .. ARGV[1] .. ' does not exist')
end
if status == 'started' then
  -- the reason is kept for whoever records the stopped run (its listener, or an adopter)
  redis.call('HSET', KEYS[1], 'cancel_requested', ARGV[2], 'cancel_reason', ARGV[3],
             'updated', ARGV[2])
  return {'requested', cur[2] or ''}
end
if status == 'failed' and redis.call('HGET', KEYS[1], 'cancelled') == ARGV[2] then
  return {'cancelled', status}  -- our own earlier try: it did cancel the task
end
if status == 'pending' then
  redis.call('LREM', KEYS[2], 1, ARGV[1])
elseif status == 'scheduled' then
  redis.call('ZREM', KEYS[3], ARGV[1])
elseif status ~= 'reserved' then
  return redis.error_reply('BLUEQUE_STATE task ' .. ARGV[1] .. ' is ' .. status
    .. ': a finished task cannot be cancelled')
end
-- a reserved task is refused by start.lua, which drops it from its listener's reserved list
remember({attempt = tonumber(cur[3]), outcome = 'cancelled', at = tonumber(ARGV[2]),
          node = cur[2] or nil, error = cut(ARGV[3]), was = status})
redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[3], 'cancelled', ARGV[2],
           'updated', ARGV[2], 'finished_at', ARGV[2])
redis.call('HDEL', KEYS[1], 'eta', 'traceback')
redis.call('LPUSH', KEYS[4], ARGV[1])
count_outcome('cancelled')
redis.call('PUBLISH', ARGV[5], ARGV[1])
return {'cancelled', status}
