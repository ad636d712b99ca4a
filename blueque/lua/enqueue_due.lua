-- enqueue_due: move due scheduled tasks to pending. Safe with several schedulers (and with
-- blueque 1.0.1's WATCH/MULTI version): ZREM decides which caller moves each task, once.
-- KEYS[1] scheduled zset       blueque_scheduled_tasks_[queue]
-- KEYS[2] pending list         blueque_pending_tasks_[queue]
-- KEYS[3..] task hashes        blueque_task_[id], in ARGV order
-- ARGV[1] now, ARGV[2] channel, ARGV[3] queue, ARGV[4..] task ids (read by ZRANGEBYSCORE)
-- Returns the ids this call moved (their `eta` removed: they are no longer scheduled).
local moved = {}
for i = 4, #ARGV do
  local key = KEYS[i - 1]
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) <= tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    local status = redis.call('HGET', key, 'status')
    if status == 'scheduled' or status == false then
      if status == 'scheduled' then
        redis.call('HSET', key, 'status', 'pending', 'updated', ARGV[1])
        redis.call('HDEL', key, 'eta')  -- no longer scheduled (the ZSET had its eta)
      end
      -- a missing hash still goes to pending: the listener records it as failed (stamp.lua)
      redis.call('LPUSH', KEYS[2], ARGV[i])
      moved[#moved + 1] = ARGV[i]
    end
  end
end
if #moved > 0 then
  redis.call('PUBLISH', ARGV[2], ARGV[3])
end
return moved
