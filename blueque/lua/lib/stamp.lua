-- lib/stamp: the stamp of a task a listener moved into its reserved list (PROTOCOL.md 5.4), for
-- the scripts that reserve: stamp.lua (the id was moved by LMOVE) and take.lua (it moves the id
-- itself). A script that says `-- uses: history, counts, stamp` gets this function before its
-- body. k: the task hash, reserved list, failed list, this minute's, all time's and this hour's
-- outcome counters and (with a pid) the started set; pid '' reserves only. Returns the verdict.
local function stamp_task(k, id, listener, now, queue, minute_ttl, pid, created)
  local function drop()
    redis.call('LREM', k[2], 1, id)
  end
  local function record_failure(reason)
    drop()
    local kind = redis.call('TYPE', k[1])['ok']
    if kind == 'hash' or kind == 'none' then
      if kind == 'none' then
        redis.call('HSET', k[1], 'queue', queue, 'created', now)
      end
      redis.call('HSET', k[1], 'status', 'failed', 'error', reason, 'updated', now)
      remember(k[1], {outcome = 'failed', at = tonumber(now), node = listener, error = cut(reason)})
    end
    redis.call('LPUSH', k[3], id)
    count_outcome('failed', 1, k[4], minute_ttl, k[5], k[6])
    return {'bad', reason}
  end
  -- the task as read once (HGETALL), kept as written: what `ok` returns, with no second read
  local flat = redis.pcall('HGETALL', k[1])
  if flat['err'] then  -- WRONGTYPE
    local kind = redis.call('TYPE', k[1])['ok']
    return record_failure('task data is a ' .. kind .. ', not a hash: cannot run it')
  end
  if #flat == 0 then  -- a hash has a field or is gone
    return record_failure('task data was missing when the task was reserved')
  end
  local task = {}
  for i = 1, #flat, 2 do
    task[flat[i]] = flat[i + 1]
  end
  local function hset(fields)
    redis.call('HSET', k[1], unpack(fields))
    for i = 1, #fields, 2 do
      task[fields[i]] = fields[i + 1]
    end
  end
  local function hdel(...)
    redis.call('HDEL', k[1], ...)
    for _, name in ipairs({...}) do
      task[name] = nil
    end
  end
  -- the writes of start.lua (PROTOCOL.md 5.5) for the given pid; `counted`: the new attempt
  -- number, written in the same HSET ({} when HINCRBY counted it, or a retried stamp)
  local function start(counted)
    redis.call('SADD', k[7], listener .. ' ' .. pid .. ' ' .. id)
    local fields = {'status', 'started', 'node', listener, 'pid', pid, 'updated', now,
                    'started_at', now, unpack(counted)}
    if created ~= '' then
      fields[#fields + 1] = 'pid_created'
      fields[#fields + 1] = created
    end
    hset(fields)
    if created == '' and task.pid_created then
      hdel('pid_created')
    end
  end
  local function ok(attempts)
    local fields = {}
    for name, value in pairs(task) do
      fields[#fields + 1] = name
      fields[#fields + 1] = value
    end
    return {'ok', attempts, fields}
  end
  local status = task.status
  if status == 'pending' then
    -- attempts + 1, written with the status (HINCRBY's rule: a whole number or nothing)
    local attempts, counted = tonumber(task.attempts or '0'), {}
    if attempts and attempts == math.floor(attempts)
        and string.find(task.attempts or '0', '^-?%d+$') then
      attempts = attempts + 1
      counted = {'attempts', string.format('%d', attempts)}
    else  -- not an integer: HINCRBY refuses it, as it always did
      attempts = redis.call('HINCRBY', k[1], 'attempts', 1)
      task.attempts = string.format('%d', attempts)
    end
    if task.eta or task.error or task.traceback then  -- the last attempt's: in the history
      hdel('eta', 'error', 'traceback')
    end
    if pid ~= '' then
      start(counted)
    else
      hset({'status', 'reserved', 'node', listener, 'updated', now, unpack(counted)})
      hdel('pid')
    end
    return ok(attempts)
  elseif status == 'reserved' and task.node == listener then
    -- a retried stamp whose first reply was lost (with a pid: start it now)
    if pid ~= '' then
      start({})
    end
    return ok(tonumber(task.attempts or '1'))
  elseif status == 'started' and pid ~= '' and task.node == listener and task.pid == pid then
    -- a retried stamp with start whose first reply was lost
    return ok(tonumber(task.attempts or '1'))
  elseif status == 'scheduled' or status == 'reserved' or status == 'started'
      or status == 'complete' or status == 'failed' then
    drop()
    return {'skip', status}
  elseif not status then
    return record_failure('task has no status field: cannot tell whether it may run')
  end
  return record_failure('unknown status ' .. string.format('%q', status) .. ': refused to run it')
end
