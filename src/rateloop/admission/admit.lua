-- Admit every check at once, or none.  One call = one admission.
-- ARGV: lease_id, recover_per_sec, lease_poll, nscopes, then per check 9 values:
--   scope_index, field, kind (b|d|l), capacity, allowed, amount, rate, scaled (0|1), extra
--   (extra: the day window's reset offset, or the lease TTL).
-- Returns {granted, now, wait, scope_index, field, never_fits, paused, pause_reason}.
local lease_id = ARGV[1]
local recover = tonumber(ARGV[2])
local poll = tonumber(ARGV[3])
local nscopes = tonumber(ARGV[4])
local now = clock()

local checks = {}
local i = 5
while i <= #ARGV do
  checks[#checks + 1] = {
    scope = tonumber(ARGV[i]), field = ARGV[i + 1], kind = ARGV[i + 2],
    capacity = tonumber(ARGV[i + 3]), allowed = tonumber(ARGV[i + 4]),
    amount = tonumber(ARGV[i + 5]), rate = tonumber(ARGV[i + 6]),
    scaled = ARGV[i + 7] == '1', extra = tonumber(ARGV[i + 8]),
  }
  i = i + 9
end

for _, c in ipairs(checks) do
  if c.amount > c.allowed then
    return {0, fmt(now), '0', c.scope, c.field, 1, 0, ''}
  end
end

local wait, w_scope, w_field, paused, reason = 0, 0, '', 0, ''
for s = 1, nscopes do
  local p = redis.call('GET', KEYS[3 * s])
  if p then
    local sep = string.find(p, '|', 1, true)
    local untl = tonumber(string.sub(p, 1, sep - 1))
    if untl - now > wait then
      wait, w_scope, w_field, paused, reason = untl - now, s, '', 1, string.sub(p, sep + 1)
    end
  end
end

local factors = {}
for _, c in ipairs(checks) do
  local h = KEYS[3 * c.scope - 2]
  local w = 0
  if c.kind == 'b' then
    local f = 1
    if c.scaled then
      f = factors[c.scope]
      if f == nil then
        f = factor_at(h, now, recover)
        factors[c.scope] = f
      end
    end
    c.eff = c.rate * f
    local v = redis.call('HMGET', h, c.field .. ':l', c.field .. ':t', c.field .. ':b')
    c.level = drained(num(v[1], 0), num(v[2], now), now, c.eff)
    local over = c.level + c.amount - c.allowed
    if over > 0 then w = over / c.eff end
    w = math.max(w, num(v[3], 0) - now)
  elseif c.kind == 'd' then
    local v = redis.call('HMGET', h, c.field .. ':c', c.field .. ':w', c.field .. ':b')
    local index, finish = day_window(now, c.extra)
    c.index, c.finish = index, finish
    c.count = 0
    if num(v[2], nil) == index then c.count = num(v[1], 0) end
    if c.count + c.amount > c.allowed then w = finish - now end
    w = math.max(w, num(v[3], 0) - now)
  else
    local z = KEYS[3 * c.scope - 1]
    redis.call('ZREMRANGEBYSCORE', z, '-inf', fmt(now))
    if redis.call('ZCARD', z) + 1 > c.allowed then
      local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
      w = math.max(math.min(tonumber(first[2]) - now, poll), 0.000001)
    end
  end
  if w > wait then
    wait, w_scope, w_field, paused, reason = w, c.scope, c.field, 0, ''
  end
end

if wait > 0 then
  return {0, fmt(now), fmt(wait), w_scope, w_field, 0, paused, reason}
end

for _, c in ipairs(checks) do
  local h = KEYS[3 * c.scope - 2]
  if c.kind == 'b' then
    local level = c.level + c.amount
    redis.call('HSET', h, c.field .. ':l', fmt(level), c.field .. ':t', fmt(now))
    keep(h, level / c.eff)
  elseif c.kind == 'd' then
    redis.call('HSET', h, c.field .. ':c', fmt(c.count + c.amount), c.field .. ':w', fmt(c.index))
    keep(h, c.finish - now)
  elseif lease_id ~= '' then
    local z = KEYS[3 * c.scope - 1]
    redis.call('ZADD', z, fmt(now + c.extra), lease_id)
    keep(z, c.extra)
  end
end
return {1, fmt(now), '0', 0, '', 0, 0, ''}
