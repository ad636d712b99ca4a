-- retry_failed: an operator re-runs a failed task: it becomes pending again, attempts kept.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] failed list          blueque_failed_tasks_[queue]
-- KEYS[3] pending list         blueque_pending_tasks_[queue]
-- KEYS[4] checkpoint hash      blueque_checkpoint_[id] (kept, so the re-run resumes from it)
-- KEYS[5] cancelled list       blueque_cancelled_tasks_[queue]
-- ARGV[1] task id, ARGV[2] now (Unix s), ARGV[3] queue, ARGV[4] channel to publish the queue
-- name on, ARGV[5] window: how far LPOS looks from each end of the failed list before a full LREM
-- ARGV[6] ms the checkpoint is kept (what a save sets: it replaces the result TTL's expiry)
-- ARGV[7] "1" to leave a cancelled task alone (a bulk retry: cancelled means never), "" to
-- retry it too (asked for by its id, or with include_cancelled)
-- Returns 1, or 0 for a cancelled task left alone (ARGV[7]); error "BLUEQUE_MISSING ..." if
-- the hash is gone, "BLUEQUE_STATE ..." unless failed, except for a repeat of this very call
-- after a lost reply (`retried_at` is ARGV[2]): 1 again.
-- The run's error moves to `last_error`; the fields of the finished run (result, node, pid,
-- finish and cancel stamps, progress, eta) are removed, and so is any expiry the result TTL set;
-- the retry is added to the task's `history` (PROTOCOL.md 3.2), after the failed run's entry
-- when only its fields said it.
-- uses: history
local cur = redis.call('HMGET', KEYS[1], 'status', 'cancelled', 'attempts')
local status = cur[1]
if not status then
  return redis.error_reply('BLUEQUE_MISSING task ' .. ARGV[1] .. ' does not exist')
end
if status ~= 'failed' and redis.call('HGET', KEYS[1], 'retried_at') == ARGV[2] then
  return 1  -- our own earlier try, whose reply was lost: it did make the task pending
end
if status ~= 'failed' then
  return redis.error_reply('BLUEQUE_STATE task ' .. ARGV[1] .. ' is ' .. status
    .. ': only a failed task can be retried')
end
if cur[2] and ARGV[7] == '1' then
  return 0
end
local window = tonumber(ARGV[5])
local function remove_near_an_end(list)  -- the common cases cost O(window), not O(length)
  if redis.call('LPOS', list, ARGV[1], 'RANK', -1, 'MAXLEN', window) then
    return redis.call('LREM', list, -1, ARGV[1]) > 0
  end
  if redis.call('LPOS', list, ARGV[1], 'MAXLEN', window) then
    return redis.call('LREM', list, 1, ARGV[1]) > 0
  end
  return false
end
-- a cancelled task is in the cancelled list; one cancelled before that list existed, in the
-- failed list
local home, other = KEYS[2], nil
if cur[2] then
  home, other = KEYS[5], KEYS[2]
end
if not remove_near_an_end(home) and not (other and remove_near_an_end(other)) then
  if redis.call('LREM', home, 1, ARGV[1]) == 0 and other then
    redis.call('LREM', other, 1, ARGV[1])
  end
end
local error_text = redis.call('HGET', KEYS[1], 'error')
if error_text then
  redis.call('HSET', KEYS[1], 'last_error', error_text)
end
-- the failed run's own entry first, when its fields are all that say it (3.2): they go now
local entries = history_of(KEYS[1])
local ran = current_entry(KEYS[1], entries)
if ran then
  entries[#entries + 1] = ran
end
local history = added(entries, {attempt = tonumber(cur[3]), outcome = 'retried',
                                at = tonumber(ARGV[2]), was = cur[2] and 'cancelled' or 'failed'})
redis.call('HSET', KEYS[1], 'history', history)
redis.call('HDEL', KEYS[1], 'error', 'result', 'node', 'pid', 'pid_created', 'eta',
           'started_at', 'finished_at', 'cancelled', 'cancel_requested', 'progress',
           'progress_message', 'traceback', 'cancel_reason')
redis.call('HSET', KEYS[1], 'status', 'pending', 'updated', ARGV[2], 'retried_at', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'retried', 1)
redis.call('PERSIST', KEYS[1])
redis.call('PEXPIRE', KEYS[4], ARGV[6])  -- no-op without a checkpoint
redis.call('LPUSH', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[4], ARGV[3])
return 1
