-- progress: a running task reports how far it has got.
-- KEYS[1] task hash            blueque_task_[id]
-- ARGV[1] attempt, ARGV[2] fraction (0..1), ARGV[3] message, ARGV[4] now
-- Returns 1, or error "BLUEQUE_STALE ..." if this run is no longer the task's current attempt.
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempts')
if cur[1] ~= 'started' or cur[2] ~= ARGV[1] then
  return redis.error_reply('BLUEQUE_STALE task is ' .. tostring(cur[1]) .. ' on attempt '
    .. tostring(cur[2]) .. ': progress of attempt ' .. ARGV[1] .. ' is not recorded')
end
redis.call('HSET', KEYS[1], 'progress', ARGV[2], 'progress_message', ARGV[3], 'updated', ARGV[4])
return 1
