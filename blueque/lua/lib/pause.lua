-- lib/pause: whether a queue is paused (PROTOCOL.md 5.16c): its blueque_paused_[queue] hash
-- exists. A script that says `-- uses: pause` gets these functions before its body; the
-- scripts that take a task (reserve, take) ask in the same atomic step as the take, so no
-- task of a queue is taken once its pause is written.
local function queue_paused(pause_key)
  return redis.call('EXISTS', pause_key) == 1
end

-- The indices i >= first of ARGV (queue names, one per index) whose queue is not paused,
-- in order: the pause keys are the last KEYS, one per such queue in ARGV's order.
local function unpaused(first)
  local open = {}
  for i = first, #ARGV do
    if not queue_paused(KEYS[#KEYS - #ARGV + i]) then
      open[#open + 1] = i
    end
  end
  return open
end
