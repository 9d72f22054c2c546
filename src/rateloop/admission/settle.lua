-- Settle a reservation: change bucket levels by the deltas, release the lease.
-- KEYS: the state hash of each scope, then the lease set of the lease scope (if any).
-- ARGV: recover_per_sec, has_lease (0|1), lease_id, starts_at (the reservation's start,
--   server time), then per adjustment 5 values:
--   scope_index, field, rate, scaled (0|1), delta.
-- Returns the server time.
local recover = tonumber(ARGV[1])
local has_lease = ARGV[2] == '1'
local lease_id = ARGV[3]
local now = clock()
local since = math.max(now, tonumber(ARGV[4]))
local i = 5
while i <= #ARGV do
  local s, field = tonumber(ARGV[i]), ARGV[i + 1]
  local h = KEYS[s]
  local rate = tonumber(ARGV[i + 2])
  local v = redis.call('HMGET', h, field .. ':l', field .. ':t', 'x', 'f', 'fs')
  if ARGV[i + 3] == '1' then rate = rate * factor_of(v[4], v[5], now, recover) end
  -- A bucket booked ahead (its ts after now) holds its level at its last start: a refund
  -- lowers it by at most what would not have drained between the reservation's own
  -- start (or now) and then.
  local ts = num(v[2], now)
  local at = math.max(ts, now)
  local delta = tonumber(ARGV[i + 4])
  if ts > now and delta < 0 then delta = math.min(0, delta + math.max(0, ts - since) * rate) end
  local level = math.max(0, drained(num(v[1], 0), ts, at, rate) + delta)
  local list = {field .. ':l', fmt(level), field .. ':t', fmt(at)}
  local ms = extend(list, v[3], now, at - now + level / rate)
  redis.call('HSET', h, unpack(list))
  if ms then redis.call('PEXPIRE', h, ms) end
  i = i + 5
end
if has_lease then
  redis.call('ZREM', KEYS[#KEYS], lease_id)
end
return fmt(now)
