-- submit: create one task, pending now or scheduled for later; idempotent on the task id.
-- uses: limits, taken
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] target               blueque_pending_tasks_[queue] (eta == "") or blueque_scheduled_tasks_[queue]
-- KEYS[3] queue config         blueque_queue_config_[queue] (read: max_parameters_bytes)
-- KEYS[4] queues (optional)    blueque_queues (absent in the cluster layout: done outside)
-- ARGV[1] task id, ARGV[2] queue, ARGV[3] parameters, ARGV[4] now (Unix s, the client's clock)
-- ARGV[5] eta ("" to enqueue now), ARGV[6] channel to publish the queue name on (pending only)
-- ARGV[7] the default max_parameters_bytes (0: none)
-- ARGV[8..] extra field/value pairs (e.g. max_attempts, time_limit)
-- Returns 1 if the task was created, 0 if a task with that id already existed in this queue
-- (nothing changed), or an error "BLUEQUE_STATE ..." if it exists in another queue, or
-- "BLUEQUE_TOO_LARGE ..." (nothing written) if its parameters are over the queue's limit. A
-- repeat of this very call (the retry after a lost reply: same created time and parameters)
-- returns 1.
-- checked before any write: parameters too large, else a task id already taken
local refused = parameters_too_large(parameters_limit(KEYS[3], ARGV[7]), ARGV[2], ARGV[3])
  or taken(KEYS[1], ARGV[1], ARGV[2], ARGV[4], ARGV[3])
if refused then
  return refused
end
local fields = {'status', 'pending', 'queue', ARGV[2], 'parameters', ARGV[3],
                'created', ARGV[4], 'updated', ARGV[4]}
if ARGV[5] ~= '' then
  fields[2] = 'scheduled'
  fields[#fields + 1] = 'eta'
  fields[#fields + 1] = ARGV[5]
end
for i = 8, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
if ARGV[5] == '' then
  -- first, before any write: a user whose ACL refuses the channel gets its NOPERM with nothing
  -- written (a script's earlier writes would stay); listeners hear it once the script is done
  redis.call('PUBLISH', ARGV[6], ARGV[2])
end
redis.call('HSET', KEYS[1], unpack(fields))
if ARGV[5] == '' then
  -- a pending list that already held a task has its queue listed (forget_queue refuses a
  -- queue that holds tasks), so only the push that makes the list lists the queue
  if redis.call('LPUSH', KEYS[2], ARGV[1]) == 1 and KEYS[4] then
    redis.call('ZADD', KEYS[4], 'NX', 0, ARGV[2])
  end
else
  if KEYS[4] then
    redis.call('ZADD', KEYS[4], 'NX', 0, ARGV[2])
  end
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
end
return 1
