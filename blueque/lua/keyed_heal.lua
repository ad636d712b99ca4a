-- keyed_heal: a sweep's look at the concurrency keys in use (PROTOCOL.md 5.22): holds whose
-- run has left its listener's reserved list (ended, refused or put back by a path that records
-- no ending) are dropped, and each key's waiters its free slots let run are woken. The
-- releases of finish and recover do this at once; this catches what they cannot see.
-- KEYS[1] keys set             blueque_concurrency_keys
-- ARGV[1] how many keys to look at (at most), ARGV[2..9] the names of
-- lib/keyed (Keys.keyed_names)
-- Returns how many ids left the waiting lists (woken, or dropped: no longer pending).
-- uses: keyed
if redis.call('SCARD', KEYS[1]) == 0 then  -- no key in use: a fleet without keys pays this
  return 0
end
local names = keyed_names(ARGV, 2)
local woken = 0
for i, key in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if i > tonumber(ARGV[1]) then
    break
  end
  live_holders(names, key)
  local before = redis.call('LLEN', names.waiting .. key)
  wake_key(names, key)
  woken = woken + before - redis.call('LLEN', names.waiting .. key)
end
return woken
