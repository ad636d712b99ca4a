-- recover: take back the tasks of a dead listener in one queue and apply the caller's verdicts.
-- KEYS[1] leases zset          blueque_leases_[queue]
-- KEYS[2] listeners set        blueque_listeners_[queue]
-- KEYS[3] reserved list        blueque_reserved_tasks_[queue]_[dead listener id]
-- KEYS[4] pending list         blueque_pending_tasks_[queue]
-- KEYS[5] started set          blueque_started_tasks_[queue]
-- KEYS[6] scheduled zset       blueque_scheduled_tasks_[queue]
-- KEYS[7] failed list          blueque_failed_tasks_[queue]
-- KEYS[8] queues zset          blueque_queues (or any same-slot key when ARGV[5] == "0")
-- KEYS[9] outcomes this minute blueque_finished_per_minute_[queue]_[minute]
-- KEYS[10] outcomes ever       blueque_outcome_counts_[queue]
-- KEYS[11] outcomes this hour  blueque_finished_per_hour_[queue]_[hour] (kept 691200 s)
-- KEYS[12] cancelled list      blueque_cancelled_tasks_[queue]
-- KEYS[13..] task hashes       blueque_task_[id], one per verdict, in ARGV order
-- ARGV[1] dead listener id, ARGV[2] now (s), ARGV[3] mode:
--   "lease": the listener's lease must exist and have expired by the server clock; removing it
--            is the claim (a second recoverer finds no lease and does nothing);
--   "host":  its death was proven on its own host (pid and create time); it must still be in
--            the listeners set (blueque 1.0.1's claim_orphan removes it first: then we back off).
-- ARGV[4] queue, ARGV[5] "1" to decrement the queue's listener count in KEYS[8],
-- ARGV[6] channel, ARGV[7] "1" to release the listener (drop its lease and set membership),
-- "0" to keep them (some of its processes still run and are being adopted),
-- ARGV[8] seconds KEYS[9] is kept, then 5 values per task: id, attempts seen, verdict (pending |
-- preempted | retry | failed | cancelled | drop; cancelled: failed, stamped cancelled, as
-- endings.decide says of a cancelled run), retry eta, error text (for preempted: why).
-- A verdict applies only if the task is still in the dead listener's reserved list with the
-- attempts the caller saw; otherwise it is skipped (a later sweep looks again).
-- then (optional) ARGV[...+8]: the names of lib/keyed (Keys.keyed_names): each recovered run's
-- hold of its concurrency key is released and the key's waiters woken (PROTOCOL.md 5.22).
-- Returns {requeued, retried, failed, skipped, cancelled} (failed counts the cancelled ones
-- too; cancelled says how many of them were), or {-1} if the claim failed (lease live or
-- gone, or the listener already claimed).
-- Each verdict but drop (and pending for a task no stamp counted an attempt of) is added to
-- the task's `history` (PROTOCOL.md 3.2); a task put back (pending, preempted, retry) loses
-- the run's node, pid and progress: its current fields describe its next attempt.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[3] == 'lease' then
  local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
  if not score or tonumber(score) > now_ms then
    return {-1}
  end
elseif redis.call('SISMEMBER', KEYS[2], ARGV[1]) == 0 then
  return {-1}
end
if ARGV[7] == '1' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  if redis.call('SREM', KEYS[2], ARGV[1]) == 1 and ARGV[5] == '1' then
    redis.call('ZINCRBY', KEYS[8], -1, ARGV[4])
  end
end
-- uses: history, counts, keyed
local tail = 9 + (#KEYS - 12) * 5  -- after the verdicts: lib/keyed's names, when given
local names = ARGV[tail] and keyed_names(ARGV, tail)
local RUN_FIELDS = {'node', 'pid', 'pid_created', 'started_at', 'progress', 'progress_message'}
local counts = {0, 0, 0, 0, 0}
for i = 13, #KEYS do
  local a = 9 + (i - 13) * 5
  local id, seen, verdict = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local cur = redis.call('HMGET', KEYS[i], 'status', 'attempts', 'pid', 'started_at')
  local attempts = cur[2] or ''
  if not redis.call('LPOS', KEYS[3], id) or attempts ~= seen then
    counts[4] = counts[4] + 1
  else
    redis.call('LREM', KEYS[3], 1, id)
    if names then  -- the run's hold of its key goes with it, whatever the verdict (5.22)
      release_key(names, id, ARGV[1], nil)
    end
    if cur[3] then
      redis.call('SREM', KEYS[5], ARGV[1] .. ' ' .. cur[3] .. ' ' .. id)
    end
    local stamped = cur[1] == 'reserved' or cur[1] == 'started'  -- an attempt was counted
    if verdict ~= 'drop' and (verdict ~= 'pending' or stamped) then
      remember(KEYS[i], {attempt = tonumber(cur[2]),
                         outcome = verdict == 'pending' and 'requeued' or verdict,
                         at = tonumber(ARGV[2]), node = ARGV[1], pid = tonumber(cur[3]),
                         started = tonumber(cur[4]),
                         error = cut(verdict == 'pending'
                                     and 'its listener ' .. ARGV[1] .. ' did not run it'
                                     or ARGV[a + 4]),
                         eta = verdict == 'retry' and tonumber(ARGV[a + 3]) or nil,
                         -- a started run recover ended: its run may report a late ending
                         recovered = cur[1] == 'started' or nil})
    end
    if verdict == 'pending' then
      redis.call('HSET', KEYS[i], 'status', 'pending', 'updated', ARGV[2])
      redis.call('HDEL', KEYS[i], unpack(RUN_FIELDS))
      redis.call('RPUSH', KEYS[4], id)
      counts[1] = counts[1] + 1
    elseif verdict == 'preempted' then  -- an adopted run its node's preemption stopped
      redis.call('HSET', KEYS[i], 'status', 'pending', 'updated', ARGV[2], 'preempted_at',
                 ARGV[2], 'preempted_reason', ARGV[a + 4])
      redis.call('HDEL', KEYS[i], unpack(RUN_FIELDS))
      redis.call('HINCRBY', KEYS[i], 'preemptions', 1)
      redis.call('RPUSH', KEYS[4], id)
      count_outcome('preempted', 1, KEYS[9], ARGV[8], KEYS[10], KEYS[11])
      counts[1] = counts[1] + 1
    elseif verdict == 'retry' then
      redis.call('HSET', KEYS[i], 'status', 'scheduled', 'eta', ARGV[a + 3], 'error', ARGV[a + 4],
                 'updated', ARGV[2])
      redis.call('HDEL', KEYS[i], 'traceback', unpack(RUN_FIELDS))
      redis.call('ZADD', KEYS[6], ARGV[a + 3], id)
      count_outcome('retry', 1, KEYS[9], ARGV[8], KEYS[10], KEYS[11])
      counts[2] = counts[2] + 1
    elseif verdict == 'failed' or verdict == 'cancelled' then
      redis.call('HSET', KEYS[i], 'status', 'failed', 'error', ARGV[a + 4], 'updated', ARGV[2])
      redis.call('HDEL', KEYS[i], 'traceback', 'pid_created')
      if verdict == 'cancelled' then
        redis.call('HSET', KEYS[i], 'cancelled', ARGV[2])  -- as a cancelled run's finish does
      end
      count_outcome(verdict, 1, KEYS[9], ARGV[8], KEYS[10], KEYS[11])
      redis.call('LPUSH', verdict == 'cancelled' and KEYS[12] or KEYS[7], id)
      counts[3] = counts[3] + 1
      if verdict == 'cancelled' then
        counts[5] = counts[5] + 1
      end
    end
  end
end
if counts[1] > 0 then
  redis.call('PUBLISH', ARGV[6], ARGV[4])
end
return counts
