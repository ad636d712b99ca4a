-- start: a process begins running a reserved task.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] started set          blueque_started_tasks_[queue]
-- KEYS[3] reserved list        blueque_reserved_tasks_[queue]_[listener id]
-- ARGV[1] task id, ARGV[2] listener id, ARGV[3] pid, ARGV[4] now, ARGV[5] attempt ("" = unfenced)
-- ARGV[6] process create time ("" if unknown)
-- Returns 1, or an error "BLUEQUE_STATE ..." / "BLUEQUE_STALE ..." (then the id leaves the
-- reserved list: the task must not run), except for a second start of a task this listener
-- already runs: refused, and left in the reserved list, where recovery finds the running one.
local cur = redis.call('HMGET', KEYS[1], 'status', 'node')
local status = cur[1]
if ARGV[5] ~= '' then
  local attempts = redis.call('HGET', KEYS[1], 'attempts')
  if attempts ~= ARGV[5] then
    redis.call('LREM', KEYS[3], 1, ARGV[1])
    return redis.error_reply('BLUEQUE_STALE task ' .. ARGV[1] .. ' is on attempt '
      .. tostring(attempts) .. ', not ' .. ARGV[5])
  end
end
if status == 'started' and redis.call('HGET', KEYS[1], 'pid') == ARGV[3] then
  return 1
end
if status == 'started' and cur[2] == ARGV[2] then
  return redis.error_reply('BLUEQUE_STATE task ' .. ARGV[1] .. ' is already started by '
    .. ARGV[2] .. ' in pid ' .. tostring(redis.call('HGET', KEYS[1], 'pid'))
    .. ': it cannot start twice')
end
if status ~= 'reserved' or cur[2] ~= ARGV[2] then
  redis.call('LREM', KEYS[3], 1, ARGV[1])
  return redis.error_reply('BLUEQUE_STATE task ' .. ARGV[1] .. ' is ' .. tostring(status)
    .. ' on ' .. tostring(cur[2]) .. ', not reserved by ' .. ARGV[2] .. ': it cannot start')
end
redis.call('SADD', KEYS[2], ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. ARGV[1])
redis.call('HSET', KEYS[1], 'status', 'started', 'pid', ARGV[3], 'updated', ARGV[4],
           'started_at', ARGV[4])
if ARGV[6] ~= '' then
  redis.call('HSET', KEYS[1], 'pid_created', ARGV[6])
end
return 1
