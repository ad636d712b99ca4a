-- cron_advance: record that a periodic task's tick has been fired (compare-and-set).
-- KEYS[1] cron hash            blueque_cron (periodic task name -> last tick fired, Unix s)
-- ARGV[1] periodic task name, ARGV[2] the last tick the caller read ("" = none recorded yet)
-- ARGV[3] the new last tick (an integer number of seconds, greater than ARGV[2])
-- Returns 1 if the tick was recorded, 0 if the stored value was no longer ARGV[2] (another
-- scheduler advanced it first: the caller re-reads and skips the ticks it has already seen).
local current = redis.call('HGET', KEYS[1], ARGV[1]) or ''
if current ~= ARGV[2] then
  return 0
end
if current ~= '' and tonumber(ARGV[3]) <= tonumber(current) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
