-- submit: create one task, pending now or scheduled for later; idempotent on the task id.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] target               blueque_pending_tasks_[queue] (eta == "") or blueque_scheduled_tasks_[queue]
-- KEYS[3] queues (optional)    blueque_queues (absent in the cluster layout: done outside)
-- ARGV[1] task id, ARGV[2] queue, ARGV[3] parameters, ARGV[4] now (Unix s, the client's clock)
-- ARGV[5] eta ("" to enqueue now), ARGV[6] channel to publish the queue name on (pending only)
-- ARGV[7..] extra field/value pairs (e.g. max_attempts, time_limit)
-- Returns 1 if the task was created, 0 if a task with that id already existed in this queue
-- (nothing changed), or an error "BLUEQUE_STATE ..." if it exists in another queue. A repeat of
-- this very call (the retry after a lost reply: same created time and parameters) returns 1.
if redis.call('EXISTS', KEYS[1]) == 1 then
  local owner = redis.call('TYPE', KEYS[1]).ok == 'hash' and redis.call('HGET', KEYS[1], 'queue')
  if owner and owner ~= ARGV[2] then
    return redis.error_reply('BLUEQUE_STATE task ' .. ARGV[1] .. ' already exists in queue '
      .. owner .. ', not ' .. ARGV[2] .. ': choose another task id')
  end
  if owner and redis.call('HGET', KEYS[1], 'created') == ARGV[4]
      and redis.call('HGET', KEYS[1], 'parameters') == ARGV[3] then
    return 1  -- our own earlier try, whose reply was lost: it did create the task
  end
  return 0
end
local fields = {'status', 'pending', 'queue', ARGV[2], 'parameters', ARGV[3],
                'created', ARGV[4], 'updated', ARGV[4]}
if ARGV[5] ~= '' then
  fields[2] = 'scheduled'
  fields[#fields + 1] = 'eta'
  fields[#fields + 1] = ARGV[5]
end
for i = 7, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[5] == '' then
  -- a pending list that already held a task has its queue listed (forget_queue refuses a
  -- queue that holds tasks), so only the push that makes the list lists the queue
  if redis.call('LPUSH', KEYS[2], ARGV[1]) == 1 and KEYS[3] then
    redis.call('ZADD', KEYS[3], 'NX', 0, ARGV[2])
  end
  redis.call('PUBLISH', ARGV[6], ARGV[2])
else
  if KEYS[3] then
    redis.call('ZADD', KEYS[3], 'NX', 0, ARGV[2])
  end
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
end
return 1
