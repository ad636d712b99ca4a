-- cancel_pending: one batch of a bulk cancel of pending tasks (Queue.cancel_waiting,
-- PROTOCOL.md 5.9b): cancel the batch's tasks still waiting at the next-in-line (right) end of
-- the pending list, as cancel.lua would each, and read the next batch. Bounded work per call.
-- KEYS[1] pending list         blueque_pending_tasks_[queue]
-- KEYS[2] cancelled list       blueque_cancelled_tasks_[queue]
-- KEYS[3] outcomes this minute blueque_finished_per_minute_[queue]_[minute]
-- KEYS[4] outcomes ever        blueque_outcome_counts_[queue]
-- KEYS[5] outcomes this hour   blueque_finished_per_hour_[queue]_[hour] (kept 691200 s)
-- KEYS[6..] task hashes        blueque_task_[id] of the batch, in ARGV order
-- ARGV[1] now, ARGV[2] error text recorded for each cancelled task, ARGV[3] seconds KEYS[3] is
-- kept, ARGV[4] the queue's done channel (waiters are woken), ARGV[5] created cutoff: only tasks
-- created at or before it ("" = any age), ARGV[6] the anchor: the kept task furthest from the
-- right end so far ("" = none yet), ARGV[7] kept: how many tasks at the right end were looked
-- at and kept (the anchor is the kept-th from the right), ARGV[8] ids to read for the next
-- batch, ARGV[9..] the batch (read by the previous call), two values per task: its id, then
-- "1" if it may be cancelled (the caller's id pattern matches it) or "0"
-- Returns {cancelled, anchor, kept, the next batch's ids...}: an empty next batch means the
-- whole list was looked at. Looked-at tasks stay contiguous at the right end: the batch is
-- the tasks just left of the anchor (found again with LPOS when listeners took tasks from the
-- right end or recovery pushed some back there), and is taken from the right until an id the
-- caller did not send (the list moved: the next call reads it). Cancelled tasks become
-- tombstones (LSET, no index moves) removed by one LREM: O(kept + batch), never O(list)
-- per task. A task a listener took meanwhile is not in the list any more: it runs.
local TOMBSTONE = 'blueque cancelled tombstone'  -- task ids have no spaces
local now, cutoff, limit = ARGV[1], ARGV[5], tonumber(ARGV[8])
local anchor, kept = ARGV[6], tonumber(ARGV[7])
-- uses: history, counts
local batch, size = {}, 0
for i = 9, #ARGV, 2 do
  size = size + 1
  batch[ARGV[i]] = {key = KEYS[5 + size], wanted = ARGV[i + 1] == '1'}
end
if anchor ~= '' and redis.call('LINDEX', KEYS[1], -kept) ~= anchor then
  local at = redis.call('LPOS', KEYS[1], anchor, 'RANK', -1, 'MAXLEN', kept + limit)
  if at then
    kept = redis.call('LLEN', KEYS[1]) - at
  else  -- gone, taken with the kept tasks right of it: look from the right end again
    anchor, kept = '', 0
  end
end
local cancelled = 0
if size > 0 then
  local window = redis.call('LRANGE', KEYS[1], -(kept + size), -(kept + 1))
  local base = kept
  for j = #window, 1, -1 do
    local id = window[j]
    local task = batch[id]
    if not task then
      break
    end
    batch[id] = nil  -- an id listed twice is looked at once
    local cur = redis.call('HMGET', task.key, 'status', 'created', 'attempts')
    local created = tonumber(cur[2])
    if task.wanted and cur[1] == 'pending'
        and (cutoff == '' or (created and created <= tonumber(cutoff))) then
      redis.call('LSET', KEYS[1], j - #window - base - 1, TOMBSTONE)
      remember(task.key, {attempt = tonumber(cur[3]), outcome = 'cancelled',
                          at = tonumber(now), error = cut(ARGV[2]), was = 'pending'})
      redis.call('HSET', task.key, 'status', 'failed', 'error', ARGV[2], 'cancelled', now,
                 'updated', now)
      redis.call('HDEL', task.key, 'eta', 'traceback')
      redis.call('LPUSH', KEYS[2], id)
      redis.call('PUBLISH', ARGV[4], id)
      cancelled = cancelled + 1
    else
      anchor, kept = id, kept + 1
    end
  end
  if cancelled > 0 then
    redis.call('LREM', KEYS[1], -cancelled, TOMBSTONE)
    count_outcome('cancelled', cancelled, KEYS[3], ARGV[3], KEYS[4], KEYS[5])
  end
end
local reply = {cancelled, anchor, kept}
for _, id in ipairs(redis.call('LRANGE', KEYS[1], -(kept + limit), -(kept + 1))) do
  reply[#reply + 1] = id
end
return reply
