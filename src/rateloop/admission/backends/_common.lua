-- Shared helpers, prepended to every rateloop admission script.
-- The arithmetic mirrors rateloop/admission/gcra.py; the conformance suite
-- runs the same tests against this and the in-memory backend.
-- A scope's state hash holds its buckets, day counts, blocks, AIMD factor, its pause
-- ('p' resume time, 'pr' reason) and 'x', the server time its key expires at.
local DAY = 86400
-- A key's TTL is set this much longer than needed, so most writes need no PEXPIRE.
local SLACK = 60

-- The server's time in seconds: integer microseconds / 10^6 (admit.lua replies those
-- microseconds, and the client divides them the same way: the same number).
local function clock()
  local t = redis.call('TIME')
  return (tonumber(t[1]) * 1000000 + tonumber(t[2])) / 1000000
end

-- TIME's reply {seconds, microseconds} as a decimal: tonumber() of it is exactly clock()
-- (both are the double nearest the same decimal), and it costs no string.format.
local function now_text(t)
  return t[1] .. '.' .. string.sub('00000' .. t[2], -6)
end

local function num(x, default)
  if x == false or x == nil or x == '' then return default end
  return tonumber(x)
end

local function fmt(x)
  return string.format('%.17g', x)
end

local function words(s)
  local t = {}
  for w in string.gmatch(s, '%S+') do t[#t + 1] = w end
  return t
end

local function drained(level, ts, now, rate)
  return math.max(0, level - math.max(0, now - ts) * rate)
end

local function day_window(wall, offset)
  local index = math.floor((wall - offset) / DAY)
  return index, (index + 1) * DAY + offset
end

-- How many more calls of `amount` a lease may borrow from a bucket whose level after the
-- borrowing call is `used` of `allowed`: a slice of the allowance that shrinks as the bucket
-- fills, within the room left (rateloop/admission/gcra.py's lease_calls).
local function lease_calls(used, allowed, amount)
  if amount <= 0 then return math.huge end
  local slice = 0.05
  if used < 0.5 * allowed then slice = 0.25 elseif used < 0.8 * allowed then slice = 0.1 end
  return math.max(0, math.floor(math.min(slice * allowed, allowed - used) / amount))
end

local function factor_of(f, fs, now, recover)
  return math.min(1, num(f, 1) + math.max(0, now - num(fs, now)) * recover)
end

-- The scope's AIMD factor at now (it recovers linearly to 1).
local function factor_at(h, now, recover)
  local v = redis.call('HMGET', h, 'f', 'fs')
  return factor_of(v[1], v[2], now, recover)
end

-- The state hash h must live `seconds` more; `x` is when it expires now (its 'x' field).
-- Appends 'x' to the field list `list` and sets the TTL only when the key would expire
-- too early (never shortens it): most writes add no command.  Returns the PEXPIRE ms
-- to apply after the HSET, or nil.
local function extend(list, x, now, seconds)
  local need = now + math.max(0, seconds) + 1
  if num(x, 0) >= need then return nil end
  local untl = need + SLACK
  list[#list + 1] = 'x'; list[#list + 1] = fmt(untl)
  return math.ceil((untl - now) * 1000)
end

-- Write the field/value pairs `...` to the state hash k, which must live `seconds` more;
-- `x` is when it expires now (its 'x' field).  The TTL is set, SLACK longer than needed,
-- only when the key would expire too early (never shortened): most writes are one HSET.
local function write_state(k, x, now, seconds, ...)
  local need = now + math.max(0, seconds) + 1
  if num(x, 0) >= need then
    redis.call('HSET', k, ...)
  else
    local untl = need + SLACK
    redis.call('HSET', k, 'x', fmt(untl), ...)
    redis.call('PEXPIRE', k, math.ceil((untl - now) * 1000))
  end
end

-- Make a key (a lease set) live at least `seconds` more (never shortens).
local function keep(key, seconds)
  local ms = math.ceil(math.max(0, seconds) * 1000) + 1000
  local current = redis.call('PTTL', key)
  if current < ms then
    redis.call('PEXPIRE', key, ms)
  end
end

-- The history (rateloop/admission/history.py): a scope's hash per hour, `base` .. ':' ..
-- epoch hour, holds one field per minute of the hour (0-59), the minute's record
-- 'name value name value ...'.  Applies `ops` = {mode, name, value, ...} to the record of
-- the minute of `now` ('+' adds, '=' sets, '<' sets only when absent, '>' keeps the
-- larger) in one HGET and one HSET; the minute's first write sets the hash to expire
-- `keep` seconds after its hour ends.
local function history(base, now, ops, keep)
  local minute = math.floor(now / 60)
  local hour = math.floor(minute / 60)
  local hk, field = base .. ':' .. hour, tostring(minute - hour * 60)
  local old = redis.call('HGET', hk, field)
  local names, vals = {}, {}
  if old then
    for n, v in string.gmatch(old, '(%S+) (%S+)') do
      names[#names + 1] = n
      vals[n] = tonumber(v)
    end
  end
  for i = 1, #ops, 3 do
    local mode, n, v = ops[i], ops[i + 1], tonumber(ops[i + 2])
    local cur = vals[n]
    if cur == nil then names[#names + 1] = n end
    if mode == '+' then v = (cur or 0) + v
    elseif mode == '<' then v = cur or v
    elseif mode == '>' then v = math.max(cur or v, v) end
    vals[n] = v
  end
  for i, n in ipairs(names) do names[i] = n .. ' ' .. fmt(vals[n]) end
  redis.call('HSET', hk, field, table.concat(names, ' '))
  if not old then redis.call('EXPIREAT', hk, (hour + 1) * 3600 + keep) end
end
