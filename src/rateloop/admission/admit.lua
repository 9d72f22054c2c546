-- Admit every check at once, or none.  One call = one admission.
-- ARGV: lease_id, recover_per_sec, lease_poll, nscopes, then per check 9 values:
--   scope_index, field, kind (b|d|l), capacity, allowed, amount, rate, scaled (0|1), extra
--   (extra: the day window's reset offset, or the lease TTL).
-- Returns {1, now} when granted, else {0, now, wait, scope_index, field, never_fits, paused,
-- pause_reason}.
--
-- Each scope's state hash is read with one HMGET and written with one HSET;
-- its TTL is then set to when all of its state stops mattering (bucket drained,
-- block and day window over, AIMD factor recovered).
local lease_id = ARGV[1]
local recover = tonumber(ARGV[2])
local poll = tonumber(ARGV[3])
local nscopes = tonumber(ARGV[4])
local now = clock()

local checks = {}
local i = 5
while i <= #ARGV do
  local c = {
    scope = tonumber(ARGV[i]), field = ARGV[i + 1], kind = ARGV[i + 2],
    capacity = tonumber(ARGV[i + 3]), allowed = tonumber(ARGV[i + 4]),
    amount = tonumber(ARGV[i + 5]), rate = tonumber(ARGV[i + 6]),
    scaled = ARGV[i + 7] == '1', extra = tonumber(ARGV[i + 8]),
  }
  if c.amount > c.allowed then
    return {0, fmt(now), '0', c.scope, c.field, 1, 0, ''}
  end
  checks[#checks + 1] = c
  i = i + 9
end

local wait, w_scope, w_field, paused, reason = 0, 0, '', 0, ''
local pause_keys = {}
for s = 1, nscopes do pause_keys[s] = KEYS[3 * s] end
local pauses = redis.call('MGET', unpack(pause_keys))
for s = 1, nscopes do
  local p = pauses[s]
  if p then
    local sep = string.find(p, '|', 1, true)
    local untl = tonumber(string.sub(p, 1, sep - 1))
    if untl - now > wait then
      wait, w_scope, w_field, paused, reason = untl - now, s, '', 1, string.sub(p, sep + 1)
    end
  end
end

-- Read every scope's hash once: the AIMD factor and the fields of its checks.
local names, state = {}, {}
for _, c in ipairs(checks) do
  if c.kind ~= 'l' then
    local list = names[c.scope]
    if list == nil then
      list = {'f', 'fs'}
      names[c.scope] = list
    end
    local f = c.field
    if c.kind == 'b' then
      list[#list + 1] = f .. ':l'; list[#list + 1] = f .. ':t'
    else
      list[#list + 1] = f .. ':c'; list[#list + 1] = f .. ':w'
    end
    list[#list + 1] = f .. ':b'
  end
end
for s, list in pairs(names) do
  local values = redis.call('HMGET', KEYS[3 * s - 2], unpack(list))
  local map = {}
  for j, name in ipairs(list) do map[name] = values[j] end
  local f = num(map['f'], 1)
  map.factor = math.min(1, f + math.max(0, now - num(map['fs'], now)) * recover)
  state[s] = map
end

for _, c in ipairs(checks) do
  local w = 0
  local map = state[c.scope]
  if c.kind == 'b' then
    c.eff = c.rate
    if c.scaled then c.eff = c.rate * map.factor end
    c.level = drained(num(map[c.field .. ':l'], 0), num(map[c.field .. ':t'], now), now, c.eff)
    local over = c.level + c.amount - c.allowed
    if over > 0 then w = over / c.eff end
    c.block = num(map[c.field .. ':b'], 0)
    w = math.max(w, c.block - now)
  elseif c.kind == 'd' then
    local index, finish = day_window(now, c.extra)
    c.index, c.finish = index, finish
    c.count = 0
    if num(map[c.field .. ':w'], nil) == index then c.count = num(map[c.field .. ':c'], 0) end
    if c.count + c.amount > c.allowed then w = finish - now end
    c.block = num(map[c.field .. ':b'], 0)
    w = math.max(w, c.block - now)
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

local writes, ttl = {}, {}
for s, map in pairs(state) do
  writes[s] = {}
  ttl[s] = 0
  if map.factor < 1 then ttl[s] = (1 - map.factor) / recover end
end
for _, c in ipairs(checks) do
  local s = c.scope
  if c.kind == 'b' then
    local level = c.level + c.amount
    local list = writes[s]
    list[#list + 1] = c.field .. ':l'; list[#list + 1] = fmt(level)
    list[#list + 1] = c.field .. ':t'; list[#list + 1] = fmt(now)
    ttl[s] = math.max(ttl[s], level / c.eff, c.block - now)
  elseif c.kind == 'd' then
    local list = writes[s]
    list[#list + 1] = c.field .. ':c'; list[#list + 1] = fmt(c.count + c.amount)
    list[#list + 1] = c.field .. ':w'; list[#list + 1] = fmt(c.index)
    ttl[s] = math.max(ttl[s], c.finish - now, c.block - now)
  elseif lease_id ~= '' then
    local z = KEYS[3 * s - 1]
    redis.call('ZADD', z, fmt(now + c.extra), lease_id)
    keep(z, c.extra)
  end
end
for s, list in pairs(writes) do
  local h = KEYS[3 * s - 2]
  redis.call('HSET', h, unpack(list))
  redis.call('PEXPIRE', h, math.ceil(ttl[s] * 1000) + 1000)
end
return {1, fmt(now)}
