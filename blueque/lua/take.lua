-- take: the listener daemon's next reservation, sent in the round trip that records an ending
-- (PROTOCOL.md 6.2, 6.7): LMOVE the oldest pending id of the first of the given queues that
-- has one into the listener's reserved list. With a pid (a warm process the listener keeps
-- for its next task), the id is stamped started by that process (lib/stamp: the stamp of 5.4)
-- and the run recorded on its node; without one (a process per task) it is only moved: the
-- listener forks its process when the slot frees, then stamps it (begin_run) as ever.
-- KEYS[1] node runs hash        blueque_node_[node identity] (with a pid)
-- then for each queue, 7 keys: pending list, reserved list, failed list, outcomes this minute,
--   outcomes ever, outcomes this hour, started set (as stamp.lua's)
-- then, last, each queue's pause hash blueque_paused_[queue], in ARGV's order (lib/pause)
-- ARGV[1] listener id, ARGV[2] now, ARGV[3] seconds a minute's counter is kept,
-- ARGV[4] pid ("" = move only), ARGV[5] the process's create time ("" if unknown),
-- ARGV[6] the run record's fields after task, queue and attempt (JSON, from ", " to "}"),
-- ARGV[7] seconds the node runs hash lives, ARGV[8] the task key's prefix (blueque_task_),
-- ARGV[9...] the queues, in the order to try (one per 7 keys)
-- Returns {} when every queue is empty, else {queue, id} (move only) or
-- {queue, id, verdict, detail[, fields]} (stamp.lua's reply; ok: the run is recorded).
-- A paused queue is skipped (5.16c).
-- uses: history, counts, stamp, pause
local listener, now, pid = ARGV[1], ARGV[2], ARGV[4]
for _, i in ipairs(unpaused(9)) do
  local queue, base = ARGV[i], 1 + (i - 9) * 7
  local id = redis.call('LMOVE', KEYS[base + 1], KEYS[base + 2], 'RIGHT', 'LEFT')
  if id then
    if pid == '' then
      return {queue, id}
    end
    local task = ARGV[8] .. id
    local reply = stamp_task({task, KEYS[base + 2], KEYS[base + 3], KEYS[base + 4],
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
return {}
