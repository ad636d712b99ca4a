-- lib/limits: a queue's limit on the size of a task's parameters (PROTOCOL.md 5.1): the
-- `max_parameters_bytes` of its blueque_queue_config_[queue], else the default the caller
-- passes (0: no limit). A script that says `-- uses: limits` gets these functions before its
-- body; it checks before it writes anything.
local function parameters_limit(config_key, default)
  return tonumber(redis.call('HGET', config_key, 'max_parameters_bytes') or '')
    or tonumber(default) or 0
end

local function parameters_too_large(limit, queue, parameters)
  if limit > 0 and #parameters > limit then
    return redis.error_reply('BLUEQUE_TOO_LARGE parameters of ' .. #parameters .. ' bytes, '
      .. 'more than the max_parameters_bytes of ' .. string.format('%d', limit)
      .. ' of queue ' .. queue)
  end
  return nil
end
