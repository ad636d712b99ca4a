-- forget_queue: remove an empty queue from blueque_queues (what `blueque status` lists).
-- KEYS[1] pending list         blueque_pending_tasks_[queue]
-- KEYS[2] scheduled zset       blueque_scheduled_tasks_[queue]
-- KEYS[3] started set          blueque_started_tasks_[queue]
-- KEYS[4] complete list        blueque_complete_tasks_[queue]
-- KEYS[5] failed list          blueque_failed_tasks_[queue]
-- KEYS[6] listeners set        blueque_listeners_[queue]
-- KEYS[7] leases zset          blueque_leases_[queue]
-- KEYS[8] queue config hash    blueque_queue_config_[queue]
-- KEYS[9] outcome counts hash  blueque_outcome_counts_[queue]
-- KEYS[10] queues              blueque_queues, or (cluster layout) KEYS[1] again: see ARGV[2]
-- KEYS[11] cancelled list      blueque_cancelled_tasks_[queue]
-- ARGV[1] queue, ARGV[2] "1" if KEYS[10] is blueque_queues, "0" if the caller removes it
-- Returns 1 if the queue was known, 0 if not; an error "BLUEQUE_STATE ..." (nothing changed)
-- if it still holds tasks or has listeners.
local held = {}
local names = {'pending', 'scheduled', 'started', 'complete', 'failed', 'cancelled'}
local counts = {redis.call('LLEN', KEYS[1]), redis.call('ZCARD', KEYS[2]),
                redis.call('SCARD', KEYS[3]), redis.call('LLEN', KEYS[4]),
                redis.call('LLEN', KEYS[5]), redis.call('LLEN', KEYS[11])}
for i = 1, 6 do
  if counts[i] > 0 then
    held[#held + 1] = counts[i] .. ' ' .. names[i]
  end
end
if #held > 0 then
  return redis.error_reply('BLUEQUE_STATE queue ' .. ARGV[1] .. ' is not empty ('
    .. table.concat(held, ', ') .. '): cancel, delete or purge its tasks first')
end
local listeners = redis.call('SCARD', KEYS[6]) + redis.call('ZCARD', KEYS[7])
if listeners > 0 then
  return redis.error_reply('BLUEQUE_STATE queue ' .. ARGV[1] .. ' has listeners registered'
    .. ' (see blueque status): stop them first; a dead one is released by recovery')
end
redis.call('DEL', KEYS[8], KEYS[9])
if ARGV[2] == '1' then
  return redis.call('ZREM', KEYS[10], ARGV[1])
end
return 1
