-- take: the listener daemon's next reservation (PROTOCOL.md 5.22, 6.2, 6.7), sent alone when a
-- slot is free or in the round trip that records an ending: the oldest pending id of the first
-- of the given queues that has one the listener may take now into its reserved list. A task
-- whose concurrency key is full moves to the key's waiting list, one that needs resources the
-- listener does not have free is passed over (it stays in line): neither blocks the tasks
-- behind it; at most 20 ids are looked at per queue. With a pid (a warm process the listener
-- keeps for its next task), the id is stamped started by that process (lib/stamp: the stamp
-- of 5.4) and the run recorded on its node; without one (a process per task) it is only moved:
-- the listener forks its process, then stamps it (begin_run) as ever.
-- KEYS[1] node runs hash        blueque_node_[node identity] (with a pid)
-- then for each queue, 8 keys: pending list, reserved list, failed list, outcomes this minute,
--   outcomes ever, outcomes this hour, started set (as stamp.lua's), queue config (its
--   default concurrency_key and requires)
-- then, last, each queue's pause hash blueque_paused_[queue], in ARGV's order (lib/pause)
-- ARGV[1] listener id, ARGV[2] now, ARGV[3] seconds a minute's counter is kept,
-- ARGV[4] pid ("" = move only), ARGV[5] the process's create time ("" if unknown),
-- ARGV[6] the run record's fields after task, queue and attempt (JSON, from ", " to "}"),
-- ARGV[7] seconds the node runs hash lives, ARGV[8] the task key's prefix (blueque_task_),
-- ARGV[9] the listener's free resources (JSON object: name -> amount),
-- ARGV[10..17] the names of lib/keyed (Keys.keyed_names),
-- ARGV[18...] the queues, in the order to try (one per 8 keys)
-- Returns {} when no queue has a task the listener may take, else {queue, id} (move only) or
-- {queue, id, verdict, detail[, fields]} (stamp.lua's reply; ok: the run is recorded).
-- A paused queue is skipped (5.16c).
-- uses: history, counts, stamp, keyed, pause
local listener, now, pid = ARGV[1], ARGV[2], ARGV[4]
local names = keyed_names(ARGV, 10)
local free = cjson.decode(ARGV[9])
local SCAN = 20

-- the id at -j (from the right, the oldest) into the reserved list
local function move(pending, reserved, j, id)
  if j == 1 then
    redis.call('LMOVE', pending, reserved, 'RIGHT', 'LEFT')
  else
    redis.call('LREM', pending, -1, id)
    redis.call('LPUSH', reserved, id)
  end
end

for _, i in ipairs(unpaused(18)) do
  local queue, base = ARGV[i], 1 + (i - 18) * 8
  local pending, reserved = KEYS[base + 1], KEYS[base + 2]
  local defaults = redis.call('HMGET', KEYS[base + 8], 'concurrency_key', 'requires')
  local j, looked = 1, 0
  while j <= SCAN and looked < 5 * SCAN do
    local id = redis.call('LINDEX', pending, -j)
    if not id then
      break
    end
    looked = looked + 1
    local verdict, key = admit(names, id, queue, listener, free, defaults)
    if verdict == 'wait' then  -- out of the line: the next id is now at -j
      redis.call('LREM', pending, -1, id)
      wait_for_key(names, key, id)
    elseif verdict == 'skip' then
      j = j + 1
    else
      move(pending, reserved, j, id)
      if pid == '' then
        return {queue, id}
      end
      local reply = stamp_task({ARGV[8] .. id, reserved, KEYS[base + 3], KEYS[base + 4],
                                KEYS[base + 5], KEYS[base + 6], KEYS[base + 7]},
                               id, listener, now, queue, ARGV[3], pid, ARGV[5])
      if reply[1] == 'ok' then  -- the run on its node, as begin_run writes it (6.2)
        redis.call('HSET', KEYS[1], pid, '{"task": ' .. cjson.encode(id) .. ', "queue": '
                   .. cjson.encode(queue) .. ', "attempt": ' .. reply[2] .. ARGV[6])
        redis.call('EXPIRE', KEYS[1], ARGV[7])
      end
      return {queue, id, reply[1], reply[2], reply[3]}
    end
  end
end
return {}
