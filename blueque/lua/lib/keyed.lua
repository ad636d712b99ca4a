-- lib/keyed: concurrency keys and resources (PROTOCOL.md 5.22), for the scripts that take a
-- task (take.lua), record a run's ending (finish.lua, recover.lua), take one back
-- (reclaim.lua), change a limit (limit.lua) and heal (keyed_heal.lua). A script that says
-- `-- uses: keyed` gets these functions before its body. A key and a queue are only known once
-- a task is read, so their keys are built from the names the caller passes (Keys.keyed_names:
-- never a key of the hash-tagged layout, where keys and resources are refused).
-- A key's slot is held by a run: its task id in blueque_key_holders_[key] names the listener
-- whose reserved list holds it, its queue and its attempt; a hold whose id has left that list
-- (its run ended, was refused or put back) is no hold. Never a timeout.
local function keyed_names(argv, at)
  return {limits = argv[at], keys = argv[at + 1], holders = argv[at + 2],
          waiting = argv[at + 3], task = argv[at + 4], pending = argv[at + 5],
          reserved = argv[at + 6], channel = argv[at + 7]}
end

local function key_limit(n, key)
  return tonumber(redis.call('HGET', n.limits, key) or '')  -- nil: no limit
end

-- the holds of a key whose run is still in its listener's reserved list (the others dropped)
local function live_holders(n, key)
  local holders = n.holders .. key
  local flat = redis.call('HGETALL', holders)
  local live = 0
  for i = 1, #flat, 2 do
    local ok, h = pcall(cjson.decode, flat[i + 1])
    if ok and type(h) == 'table' and type(h.queue) == 'string' and type(h.listener) == 'string'
        and redis.call('LPOS', n.reserved .. h.queue .. '_' .. h.listener, flat[i]) then
      live = live + 1
    else
      redis.call('HDEL', holders, flat[i])
    end
  end
  return live
end

-- whether a key has a free slot (a full one is looked at closely: stale holds dropped)
local function key_free(n, key)
  local limit = key_limit(n, key)
  if not limit then
    return true
  end
  return redis.call('HLEN', n.holders .. key) < limit or live_holders(n, key) < limit
end

local function hold_key(n, key, id, queue, listener, attempt)
  redis.call('HSET', n.holders .. key, id,
             cjson.encode({listener = listener, queue = queue, attempt = attempt}))
  redis.call('SADD', n.keys, key)
end

-- the key's oldest waiters back at the head of their queues, as many as its free slots (at
-- most 1000 a call), each queue's listeners woken; the key leaves the keys set once unused
local function wake_key(n, key)
  local limit = key_limit(n, key)
  local free = 1000
  if limit then
    free = math.min(free, limit - redis.call('HLEN', n.holders .. key))
  end
  local waiting = n.waiting .. key
  while free > 0 do
    local id = redis.call('LINDEX', waiting, -1)  -- the oldest (LPUSH in)
    if not id then
      break
    end
    redis.call('LREM', waiting, -1, id)
    local t = redis.pcall('HMGET', n.task .. id, 'status', 'queue')  -- no hash: dropped
    if not t['err'] and t[1] == 'pending' and t[2] then  -- cancelled or deleted: dropped
      redis.call('RPUSH', n.pending .. t[2], id)
      redis.call('PUBLISH', n.channel .. t[2], t[2])
      free = free - 1
    end
  end
  if redis.call('HLEN', n.holders .. key) == 0 and redis.call('LLEN', waiting) == 0 then
    redis.call('SREM', n.keys, key)
  end
end

-- a run's slot freed: its hold dropped (only its own: same listener, and attempt when known)
-- and the key's waiters woken
local function release_key(n, id, listener, attempt)
  local key = redis.pcall('HGET', n.task .. id, 'concurrency_key')
  if type(key) ~= 'string' then  -- none, or no hash
    return
  end
  local raw = redis.call('HGET', n.holders .. key, id)
  if not raw then
    return
  end
  local ok, h = pcall(cjson.decode, raw)
  if ok and type(h) == 'table' and (h.listener ~= listener
      or (attempt ~= nil and attempt ~= '' and tostring(h.attempt) ~= tostring(attempt))) then
    return  -- another run's hold (a newer attempt), or another listener's
  end
  redis.call('HDEL', n.holders .. key, id)
  wake_key(n, key)
end

-- whether resources `free` (a table) cover a task's `requires` (JSON; missing or corrupt:
-- nothing required, as a corrupt option never blocks a task)
local function resources_fit(requires, free)
  if not requires or requires == '' then
    return true
  end
  local ok, need = pcall(cjson.decode, requires)
  if not ok or type(need) ~= 'table' then
    return true
  end
  for name, amount in pairs(need) do
    if type(name) == 'string' and type(amount) == 'number' and amount > 0
        and (tonumber(free[name]) or 0) < amount then
      return false
    end
  end
  return true
end

-- may this listener take task `id` of `queue` now? defaults: its queue's {concurrency_key,
-- requires}. 'take' (the key's slot now held by the run the take starts: attempt + 1, and a
-- default written into the task so that its release and its listener read it), 'wait' and
-- the key (full), or 'skip' (it does not fit the listener's free resources)
local function admit(n, id, queue, listener, free, defaults)
  local own = redis.pcall('HMGET', n.task .. id, 'concurrency_key', 'requires', 'attempts')
  if own['err'] then  -- no hash (a foreign key): taken, for the stamp to record it bad (5.4)
    return 'take'
  end
  local key, requires = own[1] or defaults[1], own[2] or defaults[2]
  if not resources_fit(requires, free) then
    return 'skip'
  end
  if key then
    if not key_free(n, key) then
      return 'wait', key
    end
    hold_key(n, key, id, queue, listener, (tonumber(own[3] or '0') or 0) + 1)
  end
  if key and not own[1] then
    redis.call('HSET', n.task .. id, 'concurrency_key', key)
  end
  if requires and not own[2] then
    redis.call('HSET', n.task .. id, 'requires', requires)
  end
  return 'take'
end

-- a task whose key is full waits in the key's list (not in its queue: nothing spins on it)
local function wait_for_key(n, key, id)
  redis.call('LPUSH', n.waiting .. key, id)
  redis.call('SADD', n.keys, key)
end
