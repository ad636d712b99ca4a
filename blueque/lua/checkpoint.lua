-- checkpoint: a running attempt saves its task's checkpoint, fenced by attempt.
-- KEYS[1] task hash            blueque_task_[id]
-- KEYS[2] checkpoint hash      blueque_checkpoint_[id]
-- ARGV[1] task id, ARGV[2] attempt of the saving run, ARGV[3] its listener id (the task's node)
-- ARGV[4] state (text), ARGV[5] now (Unix s), ARGV[6] ms the checkpoint is kept after a save
-- Returns the state's size in bytes, or error "BLUEQUE_STALE ..." when the saving run is no
-- longer the task's current one: the task's attempts differ, it is no longer reserved or
-- started, or another listener holds it. Nothing is written then, so a superseded run can
-- never overwrite a newer attempt's checkpoint. Repeating a save whose reply was lost writes
-- the same fields again.
local cur = redis.call('HMGET', KEYS[1], 'status', 'attempts', 'node')
if cur[2] ~= ARGV[2] or (cur[1] ~= 'reserved' and cur[1] ~= 'started') or cur[3] ~= ARGV[3] then
  local now_text = 'no longer exists'
  if cur[1] then
    now_text = 'is ' .. cur[1] .. ' on attempt ' .. tostring(cur[2] or 'none') .. ' of '
      .. tostring(cur[3] or 'no listener')
  end
  return redis.error_reply('BLUEQUE_STALE task ' .. ARGV[1] .. ' ' .. now_text
    .. ': the checkpoint of its attempt ' .. ARGV[2] .. ' of ' .. ARGV[3]
    .. ' is not saved (that run was superseded or has ended)')
end
local size = string.len(ARGV[4])
redis.call('HSET', KEYS[2], 'state', ARGV[4], 'saved_at', ARGV[5], 'attempt', ARGV[2],
           'size', size)
redis.call('PEXPIRE', KEYS[2], ARGV[6])
return size
