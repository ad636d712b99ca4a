-- cancel_scheduled: one batch of a bulk cancel of scheduled tasks (Queue.cancel_waiting,
-- PROTOCOL.md 5.9b): cancel the batch's tasks still scheduled, as cancel.lua would each, and
-- read the next batch (soonest first). Bounded work per call.
-- KEYS[1] scheduled zset       blueque_scheduled_tasks_[queue]
-- KEYS[2] cancelled list       blueque_cancelled_tasks_[queue]
-- KEYS[3] outcomes this minute blueque_finished_per_minute_[queue]_[minute]
-- KEYS[4] outcomes ever        blueque_outcome_counts_[queue]
-- KEYS[5] outcomes this hour   blueque_finished_per_hour_[queue]_[hour] (kept 691200 s)
-- KEYS[6..] task hashes        blueque_task_[id] of the batch, in ARGV order
-- ARGV[1] now, ARGV[2] error text recorded for each cancelled task, ARGV[3] seconds KEYS[3] is
-- kept, ARGV[4] the queue's done channel (waiters are woken), ARGV[5] created cutoff: only tasks
-- created at or before it ("" = any age), ARGV[6] the anchor: the last task looked at and kept
-- ("" = none yet), ARGV[7] its eta (the score to go on from if it left the zset meanwhile),
-- ARGV[8] ids to read for the next batch, ARGV[9..] the batch (read by the previous call), two
-- values per task: its id, then "1" if it may be cancelled (the caller's id pattern matches it)
-- or "0"
-- Returns {cancelled, anchor, anchor's eta, the next batch's ids...}: an empty next batch
-- means the whole zset was looked at. The next batch follows the anchor (ZRANK), or, once it
-- left (moved to pending when due), the tasks from its eta on.
local now, cutoff, limit = ARGV[1], ARGV[5], tonumber(ARGV[8])
local anchor, score = ARGV[6], ARGV[7]
-- uses: history, counts
local cancelled = 0
for i = 9, #ARGV, 2 do
  local id, key = ARGV[i], KEYS[5 + (i - 7) / 2]
  local eta = redis.call('ZSCORE', KEYS[1], id)
  if eta then  -- else gone meanwhile (due, or cancelled by another call)
    local cur = redis.call('HMGET', key, 'status', 'created', 'attempts', 'node')
    local created = tonumber(cur[2])
    if ARGV[i + 1] == '1' and cur[1] == 'scheduled'
        and (cutoff == '' or (created and created <= tonumber(cutoff))) then
      redis.call('ZREM', KEYS[1], id)
      remember(key, {attempt = tonumber(cur[3]), outcome = 'cancelled', at = tonumber(now),
                     node = cur[4] or nil, error = cut(ARGV[2]), was = 'scheduled'})
      redis.call('HSET', key, 'status', 'failed', 'error', ARGV[2], 'cancelled', now,
                 'updated', now)
      redis.call('HDEL', key, 'eta', 'traceback')
      redis.call('LPUSH', KEYS[2], id)
      redis.call('PUBLISH', ARGV[4], id)
      cancelled = cancelled + 1
    else
      anchor, score = id, eta
    end
  end
end
if cancelled > 0 then
  count_outcome('cancelled', cancelled, KEYS[3], ARGV[3], KEYS[4], KEYS[5])
end
local next_batch
local rank = anchor ~= '' and redis.call('ZRANK', KEYS[1], anchor)
if rank then
  next_batch = redis.call('ZRANGE', KEYS[1], rank + 1, rank + limit)
elseif score ~= '' then
  next_batch = redis.call('ZRANGE', KEYS[1], score, '+inf', 'BYSCORE', 'LIMIT', 0, limit)
else
  next_batch = redis.call('ZRANGE', KEYS[1], 0, limit - 1)
end
local reply = {cancelled, anchor, score}
for _, id in ipairs(next_batch) do
  reply[#reply + 1] = id
end
return reply
