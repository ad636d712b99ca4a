-- stamp: finish a reservation after LMOVE/BLMOVE moved a task id into a listener's reserved list;
-- given the pid of the process that will run it, also start it (the listener daemon's way).
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] reserved list        blueque_reserved_tasks_[queue]_[listener id]
-- KEYS[3] failed list          blueque_failed_tasks_[queue]
-- KEYS[4] outcomes this minute blueque_finished_per_minute_[queue]_[minute]
-- KEYS[5] outcomes ever        blueque_outcome_counts_[queue]
-- KEYS[6] outcomes this hour   blueque_finished_per_hour_[queue]_[hour] (kept 691200 s)
-- KEYS[7] started set          blueque_started_tasks_[queue] (only with a pid)
-- ARGV[1] task id, ARGV[2] listener id, ARGV[3] now, ARGV[4] queue,
-- ARGV[5] seconds KEYS[4] is kept, ARGV[6] pid ("" = reserve only),
-- ARGV[7] the process's create time ("" if unknown)
-- Returns {verdict, detail[, fields]}:
--   {'ok', attempts, fields}  the task is now reserved (without a pid) or started by that pid
--                             (with one) for this listener, at attempt number `attempts`;
--                             fields: the task hash after the writes (HGETALL, flat)
--   {'skip', status}          not runnable (cancelled, a duplicate id, already running): id dropped
--   {'bad', reason}           missing or corrupt hash, or unknown status: recorded as failed
-- A new attempt removes what described the last one: `error`, `traceback` (they stay in the
-- task's `history`, PROTOCOL.md 3.2) and `eta` (the task is no longer scheduled); a bad task's
-- failure is added to its history.
-- uses: history, counts
local id, listener, now, pid = ARGV[1], ARGV[2], ARGV[3], ARGV[6]
local function drop()
  redis.call('LREM', KEYS[2], 1, id)
end
local function record_failure(reason)
  drop()
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind == 'hash' or kind == 'none' then
    if kind == 'none' then
      redis.call('HSET', KEYS[1], 'queue', ARGV[4], 'created', now)
    end
    redis.call('HSET', KEYS[1], 'status', 'failed', 'error', reason, 'updated', now)
    remember(KEYS[1], {outcome = 'failed', at = tonumber(now), node = listener, error = cut(reason)})
  end
  redis.call('LPUSH', KEYS[3], id)
  count_outcome('failed', 1, KEYS[4], ARGV[5], KEYS[5], KEYS[6])
  return {'bad', reason}
end
local function start()  -- the writes of start.lua (PROTOCOL.md 5.5), for the given pid
  redis.call('SADD', KEYS[7], listener .. ' ' .. pid .. ' ' .. id)
  if ARGV[7] ~= '' then
    redis.call('HSET', KEYS[1], 'status', 'started', 'node', listener, 'pid', pid,
               'updated', now, 'started_at', now, 'pid_created', ARGV[7])
  else
    redis.call('HSET', KEYS[1], 'status', 'started', 'node', listener, 'pid', pid,
               'updated', now, 'started_at', now)
    redis.call('HDEL', KEYS[1], 'pid_created')
  end
end
local function ok(attempts)
  return {'ok', attempts, redis.call('HGETALL', KEYS[1])}
end
local cur = redis.pcall('HMGET', KEYS[1], 'status', 'node', 'pid', 'attempts')
if cur['err'] then  -- WRONGTYPE
  local kind = redis.call('TYPE', KEYS[1])['ok']
  return record_failure('task data is a ' .. kind .. ', not a hash: cannot run it')
end
local status = cur[1]
if not status and redis.call('EXISTS', KEYS[1]) == 0 then
  return record_failure('task data was missing when the task was reserved')
end
if status == 'pending' then
  local attempts = redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  redis.call('HDEL', KEYS[1], 'eta', 'error', 'traceback')
  if pid ~= '' then
    start()
  else
    redis.call('HSET', KEYS[1], 'status', 'reserved', 'node', listener, 'updated', now)
    redis.call('HDEL', KEYS[1], 'pid')
  end
  return ok(attempts)
elseif status == 'reserved' and cur[2] == listener then
  -- a retried stamp whose first reply was lost (with a pid: start it now)
  if pid ~= '' then
    start()
  end
  return ok(tonumber(cur[4] or '1'))
elseif status == 'started' and pid ~= '' and cur[2] == listener and cur[3] == pid then
  -- a retried stamp with start whose first reply was lost
  return ok(tonumber(cur[4] or '1'))
elseif status == 'scheduled' or status == 'reserved' or status == 'started'
    or status == 'complete' or status == 'failed' then
  drop()
  return {'skip', status}
elseif not status then
  return record_failure('task has no status field: cannot tell whether it may run')
end
return record_failure('unknown status ' .. string.format('%q', status) .. ': refused to run it')
