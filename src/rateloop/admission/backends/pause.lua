-- Pause a scope until server-now + seconds (never shortens a longer pause).
-- KEYS[1]: the scope's state hash; KEYS[2], when the history is kept: the base of its
-- per-hour history hashes (rateloop/admission/history.py).  ARGV: seconds, reason, and
-- with KEYS[2] the seconds a history hash outlives its hour.  Returns {now, until}.
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
if KEYS[2] then
  -- the history: a pause begun this minute, its start (the first) and its end (the latest)
  history(KEYS[2], now, {'+', 'p', 1, '<', 'ps', now, '>', 'pu', untl}, tonumber(ARGV[3]))
end
return {fmt(now), fmt(untl)}
