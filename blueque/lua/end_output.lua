-- end_output: an attempt is over: its output moves out of the task's stream, with the rest of
-- its file, into the task's output tails (PROTOCOL.md 5.19).
-- KEYS[1] output stream        blueque_task_log_[id] (the running attempts' entries)
-- KEYS[2] output tails         blueque_output_[id] (a JSON object: attempt -> [offset, text])
-- ARGV[1] attempt, ARGV[2] the rest of its output (text not shipped to the stream), ARGV[3]
-- where that rest ends in the attempt's file (its offset), ARGV[4] ms the tails are kept (the
-- task's result TTL, else the log retention), ARGV[5] bytes kept of an attempt (the last 64 KiB)
-- Returns the bytes of the attempt's tail written, 0 when it had nothing (no entry, no rest:
-- nothing is written, also for a repeat of a call that moved everything already).
-- The attempt's text is what it has in the tails already (an end repeated with more), then its
-- entries' data, then the rest, cut to its last ARGV[5] bytes from a character's start; its
-- entries are removed, and the stream with its last one.
local entries = redis.call('XRANGE', KEYS[1], '-', '+')
local parts, ids = {}, {}
for _, entry in ipairs(entries) do
  local fields = {}
  for i = 1, #entry[2], 2 do
    fields[entry[2][i]] = entry[2][i + 1]
  end
  if fields.attempt == ARGV[1] and fields['end'] ~= '1' then
    ids[#ids + 1] = entry[1]
    parts[#parts + 1] = fields.data or ''
  end
end
parts[#parts + 1] = ARGV[2]
local text = table.concat(parts)
if text == '' and #ids == 0 then
  return 0
end
local ok, tails = pcall(cjson.decode, redis.call('GET', KEYS[2]) or '{}')
if not ok or type(tails) ~= 'table' then
  tails = {}
end
local before = tails[ARGV[1]]
if type(before) == 'table' and type(before[2]) == 'string' then
  text = before[2] .. text
end
local keep = tonumber(ARGV[5])
if #text > keep then  -- its last bytes, from the first that begins a character
  local cut = #text - keep + 1
  while cut <= #text and string.byte(text, cut) >= 128 and string.byte(text, cut) < 192 do
    cut = cut + 1
  end
  text = string.sub(text, cut)
end
tails[ARGV[1]] = {tonumber(ARGV[3]), text}
redis.call('SET', KEYS[2], cjson.encode(tails), 'PX', ARGV[4])
if #ids > 0 then
  for first = 1, #ids, 1000 do  -- unpack takes a few thousand values at most
    redis.call('XDEL', KEYS[1], unpack(ids, first, math.min(first + 999, #ids)))
  end
  if redis.call('XLEN', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[1])
  end
end
return #text
