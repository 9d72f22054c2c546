-- Limits learned from a provider's headers, shared by every process (zero-config).
-- ARGV[1] = 'w': store ARGV[3..] (field, value pairs) in KEYS[1], expiring after
--   ARGV[2] ms; returns 1.
-- ARGV[1] = 'r': returns, for each key, {count, field, value, ...} flattened.
if ARGV[1] == 'w' then
  redis.call('HSET', KEYS[1], unpack(ARGV, 3))
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local out = {}
for _, key in ipairs(KEYS) do
  local pairs_ = redis.call('HGETALL', key)
  out[#out + 1] = #pairs_ / 2
  for _, v in ipairs(pairs_) do out[#out + 1] = v end
end
return out
