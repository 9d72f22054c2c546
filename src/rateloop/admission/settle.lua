-- Settle a reservation: change bucket levels by the deltas, release the lease.
-- ARGV: recover_per_sec, lease_scope_index (0: none), lease_id, then per adjustment
--   5 values: scope_index, field, rate, scaled (0|1), delta.
-- Returns the server time.
local recover = tonumber(ARGV[1])
local lease_scope = tonumber(ARGV[2])
local lease_id = ARGV[3]
local now = clock()
local i = 4
while i <= #ARGV do
  local s, field = tonumber(ARGV[i]), ARGV[i + 1]
  local h = KEYS[3 * s - 2]
  local rate = tonumber(ARGV[i + 2])
  if ARGV[i + 3] == '1' then rate = rate * factor_at(h, now, recover) end
  local v = redis.call('HMGET', h, field .. ':l', field .. ':t')
  local level = math.max(0, drained(num(v[1], 0), num(v[2], now), now, rate) + tonumber(ARGV[i + 4]))
  redis.call('HSET', h, field .. ':l', fmt(level), field .. ':t', fmt(now))
  keep(h, level / rate)
  i = i + 5
end
if lease_scope > 0 then
  redis.call('ZREM', KEYS[3 * lease_scope - 1], lease_id)
end
return fmt(now)
