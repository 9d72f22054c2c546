-- Pause a scope until server-now + seconds (never shortens a longer pause).
-- KEYS[1]: the scope's state hash.  ARGV: seconds, reason.  Returns {now, until}.
local now = clock()
local seconds = tonumber(ARGV[1])
local untl = now + seconds
local v = redis.call('HMGET', KEYS[1], 'p', 'x', 'e')
local old = num(v[1], 0)
if old >= untl then return {fmt(now), fmt(old)} end
-- 'e' (refused until, see admit.lua): a start booked before the pause's end is void
local list = {'p', fmt(untl), 'pr', ARGV[2], 'e', fmt(math.max(num(v[3], 0), untl))}
local ms = extend(list, v[2], now, seconds)
redis.call('HSET', KEYS[1], unpack(list))
if ms then redis.call('PEXPIRE', KEYS[1], ms) end
return {fmt(now), fmt(untl)}
