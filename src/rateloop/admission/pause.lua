-- Pause a scope until server-now + seconds (never shortens a longer pause).
-- KEYS[1]: the scope's pause key.  ARGV: seconds, reason.  Returns {now, until}.
local now = clock()
local seconds = tonumber(ARGV[1])
local untl = now + seconds
local p = redis.call('GET', KEYS[1])
if p then
  local old = tonumber(string.sub(p, 1, string.find(p, '|', 1, true) - 1))
  if old >= untl then return {fmt(now), fmt(old)} end
end
redis.call('SET', KEYS[1], fmt(untl) .. '|' .. ARGV[2], 'PX', math.ceil(seconds * 1000) + 1)
return {fmt(now), fmt(untl)}
