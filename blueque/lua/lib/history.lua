-- lib/history: the `history` field of a task hash (PROTOCOL.md 3.2), for every script that
-- records an ending. A script that says `-- uses: history` gets these functions before its body.
local function cut(text)  -- an error as the history keeps it: 500 bytes, whole characters
  if not text or text == '' then
    return nil
  end
  if #text <= 500 then  -- protocol.HISTORY_ERROR_BYTES
    return text
  end
  local n = 500
  while n > 0 and string.byte(text, n + 1) >= 128 and string.byte(text, n + 1) < 192 do
    n = n - 1
  end
  return string.sub(text, 1, n) .. '...'
end
local function history_from(raw)  -- the entries of a field as read; a corrupt one: none
  local ok, old = pcall(cjson.decode, raw or '[]')
  local list = {}
  if ok and type(old) == 'table' then
    for i = 1, #old do
      list[i] = old[i]
    end
  end
  return list
end
local function history_of(key)  -- the entries so far
  return history_from(redis.call('HGET', key, 'history'))
end
local function added(list, entry)  -- the field with one more entry, the last 20 kept
  list[#list + 1] = entry
  while #list > 20 do  -- protocol.HISTORY_KEEP
    table.remove(list, 1)
  end
  return cjson.encode(list)
end
local function with_last(list, name, value)  -- the field, its last entry given `name` = value
  list[#list][name] = value
  return cjson.encode(list)
end
local function with_entry(key, entry)
  return added(history_of(key), entry)
end
local function remember(key, entry)  -- one JSON entry per ending
  redis.call('HSET', key, 'history', with_entry(key, entry))
end
local function current_entry(key, list)  -- a finished task's last ending as its fields say
  -- it (3.2: finish writes no entry for it), or nil when `list` (its history) ends with that
  -- ending already (written by another script, or before issue 29) or no stamp counted a run
  local f = redis.call('HMGET', key, 'status', 'attempts', 'cancelled', 'finished_at',
                       'updated', 'node', 'pid', 'started_at', 'error')
  if (f[1] ~= 'complete' and f[1] ~= 'failed') or not f[2] then
    return nil
  end
  local outcome = f[1]
  if outcome == 'failed' and f[3] then
    outcome = 'cancelled'
  end
  local at = tonumber(f[4] or f[5])
  local last = list[#list]
  if type(last) == 'table' and tostring(last.attempt) == f[2] and last.outcome == outcome
      and at and type(last.at) == 'number' and math.abs(last.at - at) < 0.001 then
    return nil
  end
  return {attempt = tonumber(f[2]), outcome = outcome, at = at, node = f[6],
          pid = tonumber(f[7]), started = tonumber(f[8]),
          error = outcome ~= 'complete' and cut(f[9]) or nil}
end
