-- Learn from the provider for one scope: an AIMD decrease after a 429 despite
-- admission, and remaining/reset headers that tighten the state.
-- KEYS[1]: the scope's state hash.  ARGV: lower (0|1), decrease, floor, recover_per_sec,
--   cooldown, then per tightening 8 values: field, kind (b|d), capacity, rate, scaled,
--   offset, remaining ('' if unknown), reset_after ('' if unknown).
-- Returns the scope's factor after the change.
local h = KEYS[1]
local lower = ARGV[1] == '1'
local decrease, floor = tonumber(ARGV[2]), tonumber(ARGV[3])
local recover, cooldown = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = clock()

local factor = factor_at(h, now, recover)
if lower then
  local last = num(redis.call('HGET', h, 'fd'), nil)
  if last == nil or now - last >= cooldown then
    factor = math.max(floor, factor * decrease)
    redis.call('HSET', h, 'f', fmt(factor), 'fs', fmt(now), 'fd', fmt(now))
    keep(h, (1 - factor) / recover + cooldown)
  end
end

local i = 6
while i <= #ARGV do
  local field, kind = ARGV[i], ARGV[i + 1]
  local capacity, rate = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local offset = tonumber(ARGV[i + 5])
  local remaining, reset = num(ARGV[i + 6], nil), num(ARGV[i + 7], nil)
  if ARGV[i + 4] == '1' then rate = rate * factor end
  local block = nil
  if remaining ~= nil and remaining < 1 and reset ~= nil and reset > 0 then
    block = now + reset
  end
  local ttl = 0
  if kind == 'b' then
    local v = redis.call('HMGET', h, field .. ':l', field .. ':t')
    local level = drained(num(v[1], 0), num(v[2], now), now, rate)
    if remaining ~= nil then level = math.max(level, capacity - remaining) end
    redis.call('HSET', h, field .. ':l', fmt(level), field .. ':t', fmt(now))
    ttl = level / rate
  else
    local v = redis.call('HMGET', h, field .. ':c', field .. ':w')
    local index, finish = day_window(now, offset)
    local count = 0
    if num(v[2], nil) == index then count = num(v[1], 0) end
    if remaining ~= nil then count = math.max(count, capacity - remaining) end
    redis.call('HSET', h, field .. ':c', fmt(count), field .. ':w', fmt(index))
    ttl = finish - now
  end
  if block ~= nil then
    local old = num(redis.call('HGET', h, field .. ':b'), 0)
    redis.call('HSET', h, field .. ':b', fmt(math.max(old, block)))
    ttl = math.max(ttl, reset)
  end
  keep(h, ttl)
  i = i + 8
end
return fmt(factor)
