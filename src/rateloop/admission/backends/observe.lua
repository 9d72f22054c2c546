-- Learn from the provider for one scope: an AIMD decrease after a 429 nothing explains,
-- and remaining/reset headers that resynchronise the state.
-- KEYS[1]: the scope's state hash.  ARGV: lower (0|1), decrease, floor, recover_per_sec,
--   cooldown, refused (0|1), then per tightening 8 values: field, kind (b|d), capacity,
--   rate, scaled, offset, remaining ('' if unknown), reset_after ('' if unknown).
-- A refusal raises 'e' (refused until, see admit.lua) to the end of the longest block it
-- states, at least now.  Returns {factor after the change, 'e'}.
local h = KEYS[1]
local lower = ARGV[1] == '1'
local decrease, floor = tonumber(ARGV[2]), tonumber(ARGV[3])
local recover, cooldown = tonumber(ARGV[4]), tonumber(ARGV[5])
local now = clock()

local head = redis.call('HMGET', h, 'f', 'fs', 'fd', 'x', 'e')
local refused, ru = ARGV[6] == '1', now
local factor = factor_of(head[1], head[2], now, recover)
local writes, ttl = {}, 0
if lower then
  local last = num(head[3], nil)
  if last == nil or now - last >= cooldown then
    factor = math.max(floor, factor * decrease)
    writes = {'f', fmt(factor), 'fs', fmt(now), 'fd', fmt(now)}
    ttl = (1 - factor) / recover + cooldown
  end
end

local i = 7
while i <= #ARGV do
  local field, kind = ARGV[i], ARGV[i + 1]
  local capacity, rate = tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])
  local offset = tonumber(ARGV[i + 5])
  local remaining, reset = num(ARGV[i + 6], nil), num(ARGV[i + 7], nil)
  if ARGV[i + 4] == '1' then rate = rate * factor end
  local block = nil
  if remaining ~= nil and remaining < 1 and reset ~= nil and reset > 0 then
    block = now + reset
    ru = math.max(ru, block)
  end
  if kind == 'b' then
    local v = redis.call('HMGET', h, field .. ':l', field .. ':t', field .. ':b')
    local ts = num(v[2], now)
    local at = math.max(ts, now)  -- a bucket booked ahead changes at its last start
    local level = drained(num(v[1], 0), ts, at, rate)
    -- remaining is said of now: drained until at
    if remaining ~= nil then level = math.max(level, capacity - remaining - (at - now) * rate) end
    writes[#writes + 1] = field .. ':l'; writes[#writes + 1] = fmt(level)
    writes[#writes + 1] = field .. ':t'; writes[#writes + 1] = fmt(at)
    ttl = math.max(ttl, at - now + level / rate)
    if block ~= nil then
      writes[#writes + 1] = field .. ':b'; writes[#writes + 1] = fmt(math.max(num(v[3], 0), block))
      ttl = math.max(ttl, reset)
    end
  else
    local v = redis.call('HMGET', h, field .. ':c', field .. ':w', field .. ':b')
    local index, finish = day_window(now, offset)
    local count = 0
    if num(v[2], nil) == index then count = num(v[1], 0) end
    if remaining ~= nil then count = math.max(count, capacity - remaining) end
    writes[#writes + 1] = field .. ':c'; writes[#writes + 1] = fmt(count)
    writes[#writes + 1] = field .. ':w'; writes[#writes + 1] = fmt(index)
    ttl = math.max(ttl, finish - now)
    if block ~= nil then
      writes[#writes + 1] = field .. ':b'; writes[#writes + 1] = fmt(math.max(num(v[3], 0), block))
      ttl = math.max(ttl, reset)
    end
  end
  i = i + 8
end
local e = num(head[5], 0)
if refused and ru > e then
  e = ru
  writes[#writes + 1] = 'e'; writes[#writes + 1] = fmt(e)
  ttl = math.max(ttl, e - now)
end
if #writes > 0 then
  local ms = extend(writes, head[4], now, ttl)
  redis.call('HSET', h, unpack(writes))
  if ms then redis.call('PEXPIRE', h, ms) end
end
return {fmt(factor), fmt(e)}
