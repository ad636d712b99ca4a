-- delete: remove a finished task's data and its entry in the complete or failed list.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] finished list        blueque_complete_tasks_[queue] or blueque_failed_tasks_[queue]
-- KEYS[3] task output stream   blueque_task_log_[id] (deleted with the hash)
-- KEYS[4] checkpoint hash      blueque_checkpoint_[id] (deleted with the hash)
-- KEYS[5] output tails         blueque_output_[id] (deleted with the hash)
-- ARGV[1] task id, ARGV[2] the status the caller believes the task has (complete | failed)
-- ARGV[3] window: how far LPOS looks from each end before falling back to a full LREM
-- Returns 1 if the hash existed, 0 if only a dangling list entry was cleaned (no key, or a
-- key that is not a hash, which is left alone);
-- error "BLUEQUE_STATE ..." if the task is not in that finished state.
-- Cost: newest and oldest entries (the common cases: a waiter deleting what it just read, a
-- purge deleting the oldest) are found within the window from one end: O(window), not O(N).
-- A key that is not a hash (stamp.lua listed it as failed and left it alone) only loses its
-- list entry here: it is not ours to delete, and HGET on it would fail every purge.
local kind = redis.call('TYPE', KEYS[1])['ok']
local status = false
if kind == 'hash' then
  status = redis.call('HGET', KEYS[1], 'status')
end
if status and status ~= ARGV[2] then
  return redis.error_reply('BLUEQUE_STATE task ' .. ARGV[1] .. ' is ' .. status .. ', not '
    .. ARGV[2] .. ': only finished tasks can be deleted')
end
local window = tonumber(ARGV[3])
if redis.call('LPOS', KEYS[2], ARGV[1], 'MAXLEN', window) then
  redis.call('LREM', KEYS[2], 1, ARGV[1])
elseif redis.call('LPOS', KEYS[2], ARGV[1], 'RANK', -1, 'MAXLEN', window) then
  redis.call('LREM', KEYS[2], -1, ARGV[1])
else
  redis.call('LREM', KEYS[2], 1, ARGV[1])
end
if kind ~= 'hash' then
  return 0
end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5])
return redis.call('DEL', KEYS[1])
