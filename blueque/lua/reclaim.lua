-- reclaim: a listener back from a cut longer than its lease takes back, for its run that still
-- lives, the task recover took from that run, when no newer attempt has started (PROTOCOL.md
-- 5.12b): the put-back attempt is withdrawn (out of the pending list or the scheduled zset) and
-- fenced (the task is started by this listener at the run's attempt again: no stamp starts a
-- started task), and the run goes on as the task's current run.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] reserved list        blueque_reserved_tasks_[queue]_[listener id]
-- KEYS[3] started set          blueque_started_tasks_[queue]
-- KEYS[4] pending list         blueque_pending_tasks_[queue]
-- KEYS[5] scheduled zset       blueque_scheduled_tasks_[queue]
-- ARGV[1] task id, ARGV[2] listener id, ARGV[3] the run's attempt, ARGV[4] its pid,
-- ARGV[5] its create time ("" unknown), ARGV[6] now, ARGV[7..14] (optional) the names of
-- lib/keyed (Keys.keyed_names): the run takes its concurrency key's slot back (recover released
-- it), or, the key being full meanwhile, the task is not taken back ({'no', ...}: PROTOCOL.md
-- 5.22, never more runs of a key than its limit)
-- Returns {'ok'} (also for a repeat whose reply was lost); {'stale', attempts} when a newer
-- attempt was stamped (the run is superseded); {'no', status} when the task is not one recover
-- took from this run while it lived and left waiting (lib/late), or it was cancelled.
-- The history's last entry (recover's) gets `reclaimed` = now; nothing is counted or published.
-- uses: history, late, keyed
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempts', 'node', 'pid', 'history')
local status = cur[1]
if cur[2] ~= ARGV[3] then
  return {'stale', cur[2] or ''}
end
if status == 'started' and cur[3] == ARGV[2] and cur[4] == ARGV[4] then
  return {'ok'}
end
if (status ~= 'scheduled' and status ~= 'pending')
    or not recovered_alive(KEYS[1], status, cur[5], ARGV[2], ARGV[3]) then
  return {'no', status or ''}
end
if ARGV[7] then
  local names = keyed_names(ARGV, 7)
  local key = redis.call('HGET', KEYS[1], 'concurrency_key')
  if key and not redis.call('HGET', names.holders .. key, ARGV[1]) then
    if not key_free(names, key) then
      return {'no', 'its concurrency key ' .. key .. ' is full'}
    end
    redis.call('LREM', names.waiting .. key, 0, ARGV[1])  -- a take may have moved it there
    hold_key(names, key, ARGV[1], redis.call('HGET', KEYS[1], 'queue'), ARGV[2],
             tonumber(ARGV[3]))
  end
end
local list = history_from(cur[5])
local started = list[#list].started  -- when the run began, as recover kept it
local history = with_last(list, 'reclaimed', tonumber(ARGV[6]))
redis.call('LREM', KEYS[4], 1, ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
local fields = {'status', 'started', 'node', ARGV[2], 'pid', ARGV[4], 'updated', ARGV[6]}
if started then
  fields[#fields + 1] = 'started_at'
  fields[#fields + 1] = tostring(started)
end
if ARGV[5] ~= '' then
  fields[#fields + 1] = 'pid_created'
  fields[#fields + 1] = ARGV[5]
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HSET', KEYS[1], 'history', history)
redis.call('HDEL', KEYS[1], 'eta', 'error', 'traceback')  -- recover's guess: in the history
if ARGV[5] == '' then
  redis.call('HDEL', KEYS[1], 'pid_created')
end
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[1])
redis.call('SADD', KEYS[3], ARGV[2] .. ' ' .. ARGV[4] .. ' ' .. ARGV[1])
return {'ok'}
