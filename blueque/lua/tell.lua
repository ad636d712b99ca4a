-- tell: tell a waiting task that one of its parents ended (or cancel the waiting task itself),
-- and release it (pending, or scheduled for its eta) when it awaits no parent any more, or end
-- it as failed when a parent did not complete and it may run only after all completed
-- (PROTOCOL.md 5.21). Idempotent: the awaited set remembers which parents were told.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] awaited parents      blueque_awaits_[id]
-- KEYS[3] waiting zset         blueque_waiting_tasks_[queue]
-- KEYS[4] pending list         blueque_pending_tasks_[queue]
-- KEYS[5] scheduled zset       blueque_scheduled_tasks_[queue]
-- KEYS[6] failed list          blueque_failed_tasks_[queue]
-- KEYS[7] cancelled list       blueque_cancelled_tasks_[queue]
-- KEYS[8] outcomes this minute blueque_finished_per_minute_[queue]_[minute]
-- KEYS[9] outcomes ever        blueque_outcome_counts_[queue]
-- KEYS[10] outcomes this hour  blueque_finished_per_hour_[queue]_[hour]
-- ARGV[1] task id, ARGV[2] parent id ("": cancel this waiting task), ARGV[3] how the parent
-- ended: complete, failed, cancelled or gone (its hash missing), ARGV[4] the error recorded if
-- this ends the task, ARGV[5] now, ARGV[6] seconds KEYS[8] is kept, ARGV[7] the queue's channel
-- (published on release to pending), ARGV[8] the queue's done channel (published when it ends),
-- ARGV[9] the queue name (what ARGV[7] carries)
-- Returns {'released', 'pending' or 'scheduled'}, {'failed', parent}, {'cancelled', ''},
-- {'waiting', parents still awaited}, {'told', ''} (this parent was told before: nothing
-- changed) or {'not waiting', status or ''} (nothing changed). A repeat of a cancel whose reply
-- was lost (`cancelled` == ARGV[5]) returns {'cancelled', ''} again.
-- uses: history, counts
local function finish(outcome)  -- the waiting task ends without running
  remember(KEYS[1], {outcome = outcome, at = tonumber(ARGV[5]), error = cut(ARGV[4]), was = 'waiting'})
  redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[4], 'updated', ARGV[5])
  redis.call('HDEL', KEYS[1], 'eta')
  if outcome == 'cancelled' then
    redis.call('HSET', KEYS[1], 'cancelled', ARGV[5])
    redis.call('LPUSH', KEYS[7], ARGV[1])
  else
    redis.call('LPUSH', KEYS[6], ARGV[1])
  end
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[3], ARGV[1])
  count_outcome(outcome, 1, KEYS[8], ARGV[6], KEYS[9], KEYS[10])
  redis.call('PUBLISH', ARGV[8], ARGV[1])
end
local cur = redis.call('HMGET', KEYS[1], 'status', 'after_any', 'eta', 'cancelled')
if cur[1] ~= 'waiting' then
  if ARGV[2] == '' and cur[1] == 'failed' and cur[4] == ARGV[5] then
    return {'cancelled', ''}  -- our own earlier try: it did cancel the task
  end
  return {'not waiting', cur[1] or ''}
end
if ARGV[2] == '' then
  finish('cancelled')
  return {'cancelled', ''}
end
if redis.call('SREM', KEYS[2], ARGV[2]) == 0 then
  return {'told', ''}
end
if ARGV[3] ~= 'complete' and cur[2] ~= '1' then
  finish('failed')
  return {'failed', ARGV[2]}
end
local left = redis.call('SCARD', KEYS[2])
if left > 0 then
  return {'waiting', tostring(left)}
end
redis.call('ZREM', KEYS[3], ARGV[1])
if cur[3] and tonumber(cur[3]) and tonumber(cur[3]) > tonumber(ARGV[5]) then
  redis.call('HSET', KEYS[1], 'status', 'scheduled', 'updated', ARGV[5])
  redis.call('ZADD', KEYS[5], cur[3], ARGV[1])
  return {'released', 'scheduled'}
end
redis.call('HSET', KEYS[1], 'status', 'pending', 'updated', ARGV[5])
redis.call('HDEL', KEYS[1], 'eta')
redis.call('LPUSH', KEYS[4], ARGV[1])
redis.call('PUBLISH', ARGV[7], ARGV[9])
return {'released', 'pending'}
