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
-- uses: history, counts
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
remember(KEYS[1], {attempt = tonumber(cur[3]), outcome = 'cancelled', at = tonumber(ARGV[2]),
          node = cur[2] or nil, error = cut(ARGV[3]), was = status})
redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[3], 'cancelled', ARGV[2],
           'updated', ARGV[2])
redis.call('HDEL', KEYS[1], 'eta', 'traceback')
redis.call('LPUSH', KEYS[4], ARGV[1])
count_outcome('cancelled', 1, KEYS[5], ARGV[4], KEYS[6], KEYS[7])
redis.call('PUBLISH', ARGV[5], ARGV[1])
return {'cancelled', status}
