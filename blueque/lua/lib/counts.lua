-- lib/counts: the outcome counters (PROTOCOL.md 5.6) of a queue: this minute's (kept
-- `minute_ttl` seconds), all time's and this hour's (kept keys.FINISHED_HOUR_TTL), each
-- given its expiry by the first count of its outcome. A script that says `-- uses: counts`
-- gets this function before its body.
local function count_outcome(outcome, n, minute_key, minute_ttl, total_key, hour_key)
  if redis.call('HINCRBY', minute_key, outcome, n) == n then  -- the minute's first of them
    redis.call('EXPIRE', minute_key, minute_ttl)
  end
  redis.call('HINCRBY', total_key, outcome, n)
  if redis.call('HINCRBY', hour_key, outcome, n) == n then  -- the hour's first of them
    redis.call('EXPIRE', hour_key, 691200)  -- keys.FINISHED_HOUR_TTL
  end
end
