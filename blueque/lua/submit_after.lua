-- submit_after: create one task that waits for other tasks (its parents) to end; idempotent on
-- the task id, as submit.lua. The parents were checked and linked (SADD blueque_dependents_[parent]
-- [id]) by the caller before this call (PROTOCOL.md 5.21).
-- uses: limits, taken
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] awaited parents      blueque_awaits_[id]
-- KEYS[3] waiting zset         blueque_waiting_tasks_[queue]
-- KEYS[4] queue config         blueque_queue_config_[queue] (read: max_parameters_bytes)
-- KEYS[5] queues (optional)    blueque_queues (absent in the cluster layout: done outside)
-- ARGV[1] task id, ARGV[2] queue, ARGV[3] parameters, ARGV[4] now (Unix s, Redis' clock)
-- ARGV[5] eta ("": pending once released; else scheduled for then, or pending if it has passed)
-- ARGV[6] the parent ids, a JSON list (written as the `after` field)
-- ARGV[7] "1": released after any ending of its parents (after_any), "": only if all complete
-- ARGV[8] when a sweep should first check its parents (Unix s: the waiting zset's score)
-- ARGV[9] the default max_parameters_bytes (0: none)
-- ARGV[10..] extra field/value pairs (options: max_attempts, time_limit...)
-- Returns 1 if the task was created, 0 if a task with that id already existed in this queue
-- (nothing changed), or an error "BLUEQUE_STATE ..." if it exists in another queue, or
-- "BLUEQUE_TOO_LARGE ..." (nothing written) if its parameters are over the queue's limit. A
-- repeat of this very call (same created time and parameters) returns 1, as submit.lua.
-- checked before any write: parameters too large, else a task id already taken
local refused = parameters_too_large(parameters_limit(KEYS[4], ARGV[9]), ARGV[2], ARGV[3])
  or taken(KEYS[1], ARGV[1], ARGV[2], ARGV[4], ARGV[3])
if refused then
  return refused
end
local fields = {'status', 'waiting', 'queue', ARGV[2], 'parameters', ARGV[3],
                'created', ARGV[4], 'updated', ARGV[4], 'after', ARGV[6]}
if ARGV[5] ~= '' then
  fields[#fields + 1] = 'eta'
  fields[#fields + 1] = ARGV[5]
end
if ARGV[7] == '1' then
  fields[#fields + 1] = 'after_any'
  fields[#fields + 1] = '1'
end
for i = 10, #ARGV do
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', KEYS[1], unpack(fields))
local parents = cjson.decode(ARGV[6])
for start = 1, #parents, 1000 do  -- unpack() of 10,000 values would overflow Lua's stack
  redis.call('SADD', KEYS[2], unpack(parents, start, math.min(start + 999, #parents)))
end
redis.call('ZADD', KEYS[3], ARGV[8], ARGV[1])
if KEYS[5] then
  redis.call('ZINCRBY', KEYS[5], 0, ARGV[2])
end
return 1
