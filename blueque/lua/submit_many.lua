-- submit_many: create many pending tasks in one call; idempotent on each task id.
-- uses: limits, taken
-- KEYS[1] pending list         blueque_pending_tasks_[queue]
-- KEYS[2] queues               blueque_queues, or "" placeholder is not allowed: see ARGV[3]
-- KEYS[3] queue config         blueque_queue_config_[queue] (read: max_parameters_bytes)
-- KEYS[4..] task hashes        blueque_task_[id], one per task, in ARGV order
-- ARGV[1] queue, ARGV[2] now, ARGV[3] "1" if KEYS[2] is the queues key, "0" if KEYS[2] is unused
-- ARGV[4] channel, ARGV[5] the default max_parameters_bytes (0: none), then pairs: ARGV[6] id1,
-- ARGV[7] parameters1, ARGV[8] id2, ..., then (optional) field/value pairs every task created
-- gets (its options: max_attempts, concurrency_key...)
-- Returns a string of '1' (created) and '0' (already existed), one character per task, or an
-- error "BLUEQUE_STATE ..." (nothing written) if an id exists in another queue, or
-- "BLUEQUE_TOO_LARGE ..." (nothing written) if one's parameters are over the queue's limit. A
-- task this very call created on an earlier try whose reply was lost (same created time and
-- parameters) is '1'.
local limit = parameters_limit(KEYS[3], ARGV[5])
for i = 4, #KEYS do
  local too_large = parameters_too_large(limit, ARGV[1], ARGV[7 + (i - 4) * 2])
  if too_large then
    return too_large
  end
  local owner = task_owner(KEYS[i])
  if owner and owner ~= ARGV[1] then
    return in_another_queue(ARGV[6 + (i - 4) * 2], owner, ARGV[1])
  end
end
-- first, before any write: a user whose ACL refuses the channel gets its NOPERM with nothing
-- written; a call that creates nothing wakes the listeners for nothing, harmlessly
redis.call('PUBLISH', ARGV[4], ARGV[1])
local shared = {}
for j = 6 + (#KEYS - 3) * 2, #ARGV do
  shared[#shared + 1] = ARGV[j]
end
local created = {}
local flags = {}
local n = 0
for i = 4, #KEYS do
  local a = 6 + (i - 4) * 2
  local existing = taken(KEYS[i], ARGV[a], ARGV[1], ARGV[2], ARGV[a + 1])
  if not existing then
    redis.call('HSET', KEYS[i], 'status', 'pending', 'queue', ARGV[1], 'parameters', ARGV[a + 1],
               'created', ARGV[2], 'updated', ARGV[2], unpack(shared))
    n = n + 1
    created[n] = ARGV[a]
    flags[#flags + 1] = '1'
  else  -- 1: created by our own earlier try, whose reply was lost; 0: another task's
    flags[#flags + 1] = tostring(existing)
  end
end
if ARGV[3] == '1' then
  redis.call('ZADD', KEYS[2], 'NX', 0, ARGV[1])  -- 1.0.1's ZINCRBY 0, without a write when listed
end
if n > 0 then
  redis.call('LPUSH', KEYS[1], unpack(created))
end
return table.concat(flags)
