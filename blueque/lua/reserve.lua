-- reserve: move the oldest pending id of a queue into a listener's reserved list (PROTOCOL.md
-- 5.4), unless the queue is paused (5.16c): the listener daemon's reserve and
-- Listener.reserve's; stamp.lua follows.
-- KEYS[1] pending list   blueque_pending_tasks_[queue]
-- KEYS[2] reserved list  blueque_reserved_tasks_[queue]_[listener id]
-- KEYS[3] pause hash     blueque_paused_[queue]
-- ARGV[1] none (ARGV is empty)
-- Returns the id moved; 0 if the queue is paused (nothing moved); nil if it has no pending id.
-- uses: pause
if queue_paused(KEYS[3]) then
  return 0
end
return redis.call('LMOVE', KEYS[1], KEYS[2], 'RIGHT', 'LEFT')
