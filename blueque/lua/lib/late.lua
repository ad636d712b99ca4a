-- lib/late: whether recover took this very attempt back from this listener while its run lived
-- (its node cut off from Redis longer than its lease) and nothing newer has happened to the
-- task since (PROTOCOL.md 5.6, "A late ending"; 5.12b): the task is failed, scheduled or
-- pending, not cancelled, and its history's last entry is that attempt ended by recover
-- (`recovered`) at this listener, as failed, retry or preempted. The caller has checked that
-- the task's attempts are still that attempt. finish.lua records such a run's late ending by
-- it, reclaim.lua takes the task back for the run by it; endings.late_ending_allowed is the
-- same rule in Python. A script that says `-- uses: history, late` gets this function before
-- its body. key: the task hash; raw: its history as read.
local function recovered_alive(key, status, raw, listener, attempt)
  if status ~= 'failed' and status ~= 'scheduled' and status ~= 'pending' then
    return false
  end
  if redis.call('HEXISTS', key, 'cancelled') == 1 then
    return false
  end
  local last = history_from(raw)
  last = last[#last]
  return type(last) == 'table' and last.recovered == true and last.node == listener
    and tostring(last.attempt) == attempt
    and (last.outcome == 'failed' or last.outcome == 'retry' or last.outcome == 'preempted')
end
