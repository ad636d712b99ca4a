-- lease: a listener's liveness lease in one queue, timed by the Redis server's clock.
-- KEYS[1] leases zset          blueque_leases_[queue]
-- ARGV[1] listener id, ARGV[2] lease length in ms, ARGV[3] mode: register | renew | release
-- Returns the new deadline (server ms), 0 for release, or -1 when `renew` finds the lease gone
-- (the listener was declared dead and its tasks recovered: it must register again).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[3] == 'release' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
if ARGV[3] == 'renew' and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return -1
end
local deadline = now + tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], deadline, ARGV[1])
return deadline
