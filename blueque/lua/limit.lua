-- limit: set or clear a concurrency key's limit (Client.set_limit, blueque limit; PROTOCOL.md
-- 5.22), and wake the key's waiters its new slots let run (a raised or cleared limit).
-- KEYS[1] limits hash          blueque_limits
-- ARGV[1] the key, ARGV[2] the limit (a whole number >= 0; "" clears it: no limit),
-- ARGV[3..10] the names of lib/keyed (Keys.keyed_names)
-- Returns the key's holders then (runs holding a slot; a lowered limit stops none of them:
-- no new run of the key starts until they are under it).
-- uses: keyed
local names = keyed_names(ARGV, 3)
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
live_holders(names, ARGV[1])
wake_key(names, ARGV[1])
return redis.call('HLEN', names.holders .. ARGV[1])
