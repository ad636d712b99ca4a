-- stamp: finish a reservation after LMOVE/BLMOVE moved a task id into a listener's reserved list.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] reserved list        blueque_reserved_tasks_[queue]_[listener id]
-- KEYS[3] failed list          blueque_failed_tasks_[queue]
-- KEYS[4] outcomes this minute blueque_finished_per_minute_[queue]_[minute]
-- KEYS[5] outcomes ever        blueque_outcome_counts_[queue]
-- ARGV[1] task id, ARGV[2] listener id, ARGV[3] now, ARGV[4] queue,
-- ARGV[5] seconds KEYS[4] is kept
-- Returns {verdict, detail}:
--   {'ok', attempts}      the task is now reserved by this listener for attempt number `attempts`
--   {'skip', status}      not runnable (cancelled, a duplicate id, already running): id dropped
--   {'bad', reason}       missing or corrupt hash, or unknown status: recorded as failed
local function count_outcome(outcome)  -- the outcome counters (PROTOCOL.md 5.6)
  redis.call('HINCRBY', KEYS[4], outcome, 1)
  redis.call('EXPIRE', KEYS[4], ARGV[5])
  redis.call('HINCRBY', KEYS[5], outcome, 1)
end
local id = ARGV[1]
local function drop()
  redis.call('LREM', KEYS[2], 1, id)
end
local function record_failure(reason)
  drop()
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind == 'hash' or kind == 'none' then
    if kind == 'none' then
      redis.call('HSET', KEYS[1], 'queue', ARGV[4], 'created', ARGV[3])
    end
    redis.call('HSET', KEYS[1], 'status', 'failed', 'error', reason, 'updated', ARGV[3])
  end
  redis.call('LPUSH', KEYS[3], id)
  count_outcome('failed')
  return {'bad', reason}
end
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'none' then
  return record_failure('task data was missing when the task was reserved')
elseif kind ~= 'hash' then
  return record_failure('task data is a ' .. kind .. ', not a hash: cannot run it')
end
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'pending' then
  redis.call('HSET', KEYS[1], 'status', 'reserved', 'node', ARGV[2], 'updated', ARGV[3])
  redis.call('HDEL', KEYS[1], 'pid')
  return {'ok', redis.call('HINCRBY', KEYS[1], 'attempts', 1)}
elseif status == 'reserved' and redis.call('HGET', KEYS[1], 'node') == ARGV[2] then
  -- a retried stamp whose first reply was lost
  return {'ok', tonumber(redis.call('HGET', KEYS[1], 'attempts') or '1')}
elseif status == 'scheduled' or status == 'reserved' or status == 'started'
    or status == 'complete' or status == 'failed' then
  drop()
  return {'skip', status}
elseif not status then
  return record_failure('task has no status field: cannot tell whether it may run')
end
return record_failure('unknown status ' .. string.format('%q', status) .. ': refused to run it')
