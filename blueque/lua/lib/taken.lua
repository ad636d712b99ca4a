-- lib/taken: what a submit does with a task id that is already taken (PROTOCOL.md 5.1, 5.2,
-- 5.21): a task of another queue is an error; a task of this queue that this very call created
-- on an earlier try whose reply was lost (the same created time and parameters) counts as
-- created; any other is left as it is. A script that says `-- uses: taken` gets these
-- functions before its body.
local function task_owner(task_key)  -- the queue of the task hash, false if it names none
  return redis.call('TYPE', task_key).ok == 'hash' and redis.call('HGET', task_key, 'queue')
end

local function in_another_queue(id, owner, queue)
  return redis.error_reply('BLUEQUE_STATE task ' .. id .. ' already exists in queue '
    .. owner .. ', not ' .. queue .. ': choose another task id')
end

-- nil when the id is free; else what the submit returns for it: 1 (our own earlier try), 0
-- (another task: nothing changed) or the BLUEQUE_STATE error of a task in another queue
local function taken(task_key, id, queue, created, parameters)
  if redis.call('EXISTS', task_key) == 0 then
    return nil
  end
  local owner = task_owner(task_key)
  if owner and owner ~= queue then
    return in_another_queue(id, owner, queue)
  end
  if owner and redis.call('HGET', task_key, 'created') == created
      and redis.call('HGET', task_key, 'parameters') == parameters then
    return 1  -- our own earlier try, whose reply was lost: it did create the task
  end
  return 0
end
