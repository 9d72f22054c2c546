-- Admit every check at once, or none.  One call = one admission.
-- KEYS: the state hash of each scope (nscopes), then the lease set of the lease scope.
-- ARGV[1], the plan (fixed per route and priority): "poll nscopes" then per check 7 words:
--   scope_index field kind (b|d|l) capacity rate scaled (0|1) extra
--   (extra: the day window's reset offset, or the lease TTL).
-- ARGV[2], this call: "lease_id recover_per_sec book" then per check "allowed amount"
--   (lease_id '-' when none; book: the longest start ahead a booking may take, 0 for none).
-- Returns {1, now} when granted, {1, now, starts_in} when booked (only bucket levels made it
-- wait, at most `book` seconds: the buckets are charged now and the call starts later), else
-- {0, now, wait, scope_index, field, never_fits, paused, pause_reason}.
--
-- Each scope's hash is read with one HMGET and written with one HSET; its TTL is set only
-- when the state would outlive it (see extend).
local plan, call = words(ARGV[1]), words(ARGV[2])
local poll, nscopes = tonumber(plan[1]), tonumber(plan[2])
local lease_id, recover, book = call[1], tonumber(call[2]), tonumber(call[3])
local now = clock()

local checks = {}
local p, q = 3, 4
while p <= #plan do
  local c = {
    scope = tonumber(plan[p]), field = plan[p + 1], kind = plan[p + 2],
    capacity = tonumber(plan[p + 3]), rate = tonumber(plan[p + 4]),
    scaled = plan[p + 5] == '1', extra = tonumber(plan[p + 6]),
    allowed = tonumber(call[q]), amount = tonumber(call[q + 1]),
  }
  if c.amount > c.allowed then
    return {0, fmt(now), '0', c.scope, c.field, 1, 0, ''}
  end
  checks[#checks + 1] = c
  p, q = p + 7, q + 2
end

-- Read every scope's hash once: pause, expiry, AIMD factor and the fields of its checks.
local names = {}
for s = 1, nscopes do names[s] = {'p', 'pr', 'x', 'f', 'fs'} end
for _, c in ipairs(checks) do
  if c.kind ~= 'l' then
    local list, f = names[c.scope], c.field
    if c.kind == 'b' then
      list[#list + 1] = f .. ':l'; list[#list + 1] = f .. ':t'
    else
      list[#list + 1] = f .. ':c'; list[#list + 1] = f .. ':w'
    end
    list[#list + 1] = f .. ':b'
  end
end
local wait, w_scope, w_field, paused, reason = 0, 0, '', 0, ''
local hard = 0  -- the longest wait a booking cannot cover (pause, day, lease, block)
local state = {}
for s = 1, nscopes do
  local list = names[s]
  local values = redis.call('HMGET', KEYS[s], unpack(list))
  local map = {}
  for j, name in ipairs(list) do map[name] = values[j] end
  map.factor = factor_of(map['f'], map['fs'], now, recover)
  local untl = num(map['p'], 0)
  if untl - now > wait then
    wait, w_scope, w_field, paused, reason = untl - now, s, '', 1, map['pr'] or ''
    hard = wait
  end
  state[s] = map
end

for _, c in ipairs(checks) do
  local w = 0
  local map = state[c.scope]
  if c.kind == 'b' then
    c.eff = c.rate
    if c.scaled then c.eff = c.rate * map.factor end
    -- A bucket booked ahead holds its level at its last start (ts > now): a call starts
    -- after it.  c.level is the level at c.base.
    local ts = num(map[c.field .. ':t'], now)
    c.base = math.max(ts, now)
    c.level = drained(num(map[c.field .. ':l'], 0), ts, c.base, c.eff)
    local over = c.level + c.amount - c.allowed
    w = c.base - now
    if over > 0 then w = w + over / c.eff end
    c.block = num(map[c.field .. ':b'], 0)
    hard = math.max(hard, c.block - now)
    w = math.max(w, c.block - now)
  elseif c.kind == 'd' then
    local index, finish = day_window(now, c.extra)
    c.index, c.finish = index, finish
    c.count = 0
    if num(map[c.field .. ':w'], nil) == index then c.count = num(map[c.field .. ':c'], 0) end
    if c.count + c.amount > c.allowed then w = finish - now end
    c.block = num(map[c.field .. ':b'], 0)
    w = math.max(w, c.block - now)
    hard = math.max(hard, w)
  else
    local z = KEYS[nscopes + 1]
    redis.call('ZREMRANGEBYSCORE', z, '-inf', fmt(now))
    if redis.call('ZCARD', z) + 1 > c.allowed then
      local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
      w = math.max(math.min(tonumber(first[2]) - now, poll), 0.000001)
      hard = math.max(hard, w)
    end
  end
  if w > wait then
    wait, w_scope, w_field, paused, reason = w, c.scope, c.field, 0, ''
  end
end

if wait > 0 and (hard > 0 or wait > book) then
  return {0, fmt(now), fmt(wait), w_scope, w_field, 0, paused, reason}
end

-- Booked (wait > 0): each bucket is charged at the start, now + wait.
local at = now + wait
local writes, ttl = {}, {}
for _, c in ipairs(checks) do
  local s = c.scope
  if writes[s] == nil then
    writes[s] = {}
    local factor = state[s].factor
    ttl[s] = 0
    if factor < 1 then ttl[s] = (1 - factor) / recover end
  end
  if c.kind == 'b' then
    local level = math.max(0, c.level - (at - c.base) * c.eff) + c.amount
    local list = writes[s]
    list[#list + 1] = c.field .. ':l'; list[#list + 1] = fmt(level)
    list[#list + 1] = c.field .. ':t'; list[#list + 1] = fmt(at)
    ttl[s] = math.max(ttl[s], at - now + level / c.eff, c.block - now)
  elseif c.kind == 'd' then
    local list = writes[s]
    list[#list + 1] = c.field .. ':c'; list[#list + 1] = fmt(c.count + c.amount)
    list[#list + 1] = c.field .. ':w'; list[#list + 1] = fmt(c.index)
    ttl[s] = math.max(ttl[s], c.finish - now, c.block - now)
  elseif lease_id ~= '-' then
    local z = KEYS[nscopes + 1]
    redis.call('ZADD', z, fmt(now + c.extra), lease_id)
    keep(z, c.extra)
  end
end
for s, list in pairs(writes) do
  if #list > 0 then
    local ms = extend(list, state[s]['x'], now, ttl[s])
    redis.call('HSET', KEYS[s], unpack(list))
    if ms then redis.call('PEXPIRE', KEYS[s], ms) end
  end
end
if wait > 0 then return {1, fmt(now), fmt(wait)} end
return {1, fmt(now)}
