-- finish: record the outcome of one run: complete, failed, failed-and-retried later, or
-- preempted (back to pending at the head of the line, without spending an attempt).
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] reserved list        blueque_reserved_tasks_[queue]_[listener id]
-- KEYS[3] started set          blueque_started_tasks_[queue]
-- KEYS[4] target               complete list, failed list (cancelled list for a cancelled
--                              run), scheduled zset (retry), or pending list (preempted)
-- KEYS[5] outcomes this minute blueque_finished_per_minute_[queue]_[minute]
-- KEYS[6] outcomes ever        blueque_outcome_counts_[queue]
-- KEYS[7] outcomes this hour   blueque_finished_per_hour_[queue]_[hour] (kept 691200 s)
-- KEYS[8] checkpoint hash      blueque_checkpoint_[id] (follows the result TTL)
-- KEYS[9] listener's counts    blueque_listener_counts_[queue]_[listener id] (kept 604800 s)
-- KEYS[10] listeners seen      blueque_listeners_seen_[queue] (kept 604800 s)
-- KEYS[11] pending list, KEYS[12] scheduled zset, KEYS[13] failed list: where recover put a
--         task whose late ending this is (PROTOCOL.md 5.6)
-- ARGV[1] task id, ARGV[2] listener id, ARGV[3] pid ("" if it never started)
-- ARGV[4] outcome: complete | failed | retry | preempted, ARGV[5] result, error text or (for
-- preempted) why, ARGV[6] now
-- ARGV[7] attempt ("" = unfenced), ARGV[8] retry eta, ARGV[9] result ttl ms ("" = keep)
-- ARGV[10] channel to publish the task id on, ARGV[11] "cancelled" when a failed run was
-- cancelled (endings.decide: the task is stamped cancelled = now) else "", ARGV[12] "renews"
-- when the listener named is the caller and renews its record (below) at each lease renewal
-- ARGV[13] seconds KEYS[5] is kept
-- ARGV[14] traceback of a failed or retried run ("" none: an older traceback is removed)
-- ARGV[15] the queue's channel, ARGV[16] the queue (preempted: published, the task is pending)
-- ARGV[17..24] (optional) the names of lib/keyed (Keys.keyed_names): the run's hold of its
-- concurrency key is released and the key's waiters woken (PROTOCOL.md 5.22)
-- Returns the status written, or an error "BLUEQUE_STATE ..." / "BLUEQUE_STALE ...".
-- Repeating a fenced call whose reply was lost (a failover) returns the recorded status again.
-- A task put back (retry, preempted) has the ending appended to its `history` (PROTOCOL.md
-- 3.2) and drops the run's node, pid and progress: the current fields describe the current
-- attempt only. A finished one (complete, failed) has its fields as its last entry: nothing is
-- appended; complete drops an earlier attempt's `error` and `traceback`, both the run's
-- `pid_created` (its process is gone).
-- uses: history, counts, late, keyed
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempts', 'pid', 'node', 'started_at',
                      'error', 'traceback', 'pid_created', 'history')
local status = cur[1]
if ARGV[7] ~= '' and cur[2] ~= ARGV[7] then
  return redis.error_reply('BLUEQUE_STALE task ' .. ARGV[1] .. ' is on attempt '
    .. tostring(cur[2]) .. ', not ' .. ARGV[7] .. ': this outcome is not recorded')
end
local recorded = {complete = 'complete', failed = 'failed', retry = 'scheduled',
                  preempted = 'pending'}
local counted = ARGV[4]
if counted == 'failed' and ARGV[11] == 'cancelled' then
  counted = 'cancelled'
end
-- our own earlier try: by its listener (kept on a finished task) or, for a task put back
-- (its node removed), by the history's last entry: this attempt, ended so by this listener
if ARGV[7] ~= '' and status == recorded[ARGV[4]] then
  local last = history_from(cur[9])
  last = last[#last]
  if cur[4] == ARGV[2] or (type(last) == 'table' and last.node == ARGV[2]
      and last.outcome == counted and tostring(last.attempt) == ARGV[7]) then
    return status
  end
end
-- a late ending: recover took this very attempt back from this listener (it was cut off
-- longer than its lease) and no newer attempt has started: the run's real ending is recorded
local function late()
  if ARGV[7] == '' or not KEYS[13] then
    return false
  end
  return recovered_alive(KEYS[1], status, cur[9], ARGV[2], ARGV[7])
end
if status ~= 'reserved' and status ~= 'started' then
  if not late() then
    return redis.error_reply('BLUEQUE_STATE task ' .. ARGV[1] .. ' is ' .. tostring(status)
      .. ': only a reserved or started task can finish')
  end
  redis.call('LREM', KEYS[11], 1, ARGV[1])
  redis.call('ZREM', KEYS[12], ARGV[1])
  redis.call('LREM', KEYS[13], 1, ARGV[1])
end
local pid = ARGV[3]
if pid == '' and cur[3] then
  pid = cur[3]
end
redis.call('LREM', KEYS[2], 1, ARGV[1])
redis.call('SREM', KEYS[3], ARGV[2] .. ' ' .. pid .. ' ' .. ARGV[1])
if ARGV[17] then
  release_key(keyed_names(ARGV, 17), ARGV[1], ARGV[2], ARGV[7])
end
local outcome = ARGV[4]
-- a task put back gets the history's new entry in the HSET of its status; a finished task's
-- entry is its fields (3.2): its hash holds nothing twice, and one that completed stays compact
local history = added(history_from(cur[9]), {attempt = tonumber(cur[2]), outcome = counted,
          at = tonumber(ARGV[6]), node = ARGV[2], pid = tonumber(pid),
          started = tonumber(cur[5]), error = cut(ARGV[5]),
          eta = outcome == 'retry' and tonumber(ARGV[8]) or nil})
local gone = {}  -- fields of the run's or an earlier attempt's that a finished task drops
if cur[8] then
  gone[#gone + 1] = 'pid_created'
end
if outcome == 'complete' then
  redis.call('HSET', KEYS[1], 'status', 'complete', 'result', ARGV[5], 'updated', ARGV[6])
  if cur[6] or cur[7] then  -- an earlier attempt's: in the history
    gone[#gone + 1] = 'error'
    gone[#gone + 1] = 'traceback'
  end
  if #gone > 0 then
    redis.call('HDEL', KEYS[1], unpack(gone))
  end
  redis.call('LPUSH', KEYS[4], ARGV[1])
elseif outcome == 'failed' then
  redis.call('HSET', KEYS[1], 'status', 'failed', 'error', ARGV[5], 'updated', ARGV[6])
  if #gone > 0 then
    redis.call('HDEL', KEYS[1], unpack(gone))
  end
  redis.call('LPUSH', KEYS[4], ARGV[1])
elseif outcome == 'preempted' then
  redis.call('HSET', KEYS[1], 'status', 'pending', 'updated', ARGV[6], 'preempted_at', ARGV[6],
             'preempted_reason', ARGV[5], 'history', history)
  redis.call('HDEL', KEYS[1], 'node', 'pid', 'pid_created', 'started_at', 'progress',
             'progress_message')
  redis.call('HINCRBY', KEYS[1], 'preemptions', 1)
  redis.call('RPUSH', KEYS[4], ARGV[1])
  redis.call('PUBLISH', ARGV[15], ARGV[16])
  outcome = 'pending'
else
  redis.call('HSET', KEYS[1], 'status', 'scheduled', 'error', ARGV[5], 'updated', ARGV[6],
             'eta', ARGV[8], 'history', history)
  redis.call('HDEL', KEYS[1], 'node', 'pid', 'pid_created', 'started_at', 'progress',
             'progress_message')
  redis.call('ZADD', KEYS[4], ARGV[8], ARGV[1])
  outcome = 'scheduled'
end
if outcome ~= 'complete' and outcome ~= 'pending' then  -- the traceback explains the error
  if ARGV[14] and ARGV[14] ~= '' then
    redis.call('HSET', KEYS[1], 'traceback', ARGV[14])
  else
    redis.call('HDEL', KEYS[1], 'traceback')
  end
end
if ARGV[11] == 'cancelled' then
  redis.call('HSET', KEYS[1], 'cancelled', ARGV[6])
end
local final = outcome == 'complete' or outcome == 'failed'
if ARGV[9] ~= '' and final then
  redis.call('PEXPIRE', KEYS[1], ARGV[9])
end
if ARGV[9] ~= '' and final then
  redis.call('PEXPIRE', KEYS[8], ARGV[9])  -- the checkpoint goes with its task
end
count_outcome(counted, 1, KEYS[5], ARGV[13], KEYS[6], KEYS[7])
local kept = 604800  -- keys.LISTENER_COUNTS_TTL: the runs of a listener, 7 days after its last
-- the listener's own record: its count, and (at its first ending of this outcome, or when the
-- caller is no listener that renews: ARGV[12] '') its counts' expiry and its listeners-seen
-- entry; a listener that renews writes those two at its renewals (PROTOCOL.md 6, step 2)
if redis.call('HINCRBY', KEYS[9], counted, 1) == 1 or ARGV[12] ~= 'renews' then
  redis.call('EXPIRE', KEYS[9], kept)
  if redis.call('ZADD', KEYS[10], ARGV[6], ARGV[2]) == 1 then  -- a listener new to the set:
    -- the set only grows then, so the entries older than 7 days are dropped then
    redis.call('ZREMRANGEBYSCORE', KEYS[10], '-inf', tonumber(ARGV[6]) - kept)
  end
  redis.call('EXPIRE', KEYS[10], kept)
end
if outcome ~= 'pending' then  -- a preempted task is not done: nobody waiting is woken
  redis.call('PUBLISH', ARGV[10], ARGV[1])
end
return outcome
