-- Shared helpers, prepended to every rateloop admission script.
-- The arithmetic mirrors rateloop/admission/gcra.py; the conformance suite
-- runs the same tests against this and the in-memory backend.
-- Keys per scope i: KEYS[3i-2] state hash, KEYS[3i-1] lease zset, KEYS[3i] pause string.
local DAY = 86400

local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function num(x, default)
  if x == false or x == nil or x == '' then return default end
  return tonumber(x)
end

local function fmt(x)
  return string.format('%.17g', x)
end

local function drained(level, ts, now, rate)
  return math.max(0, level - math.max(0, now - ts) * rate)
end

local function day_window(wall, offset)
  local index = math.floor((wall - offset) / DAY)
  return index, (index + 1) * DAY + offset
end

-- The scope's AIMD factor at now (it recovers linearly to 1).
local function factor_at(h, now, recover)
  local v = redis.call('HMGET', h, 'f', 'fs')
  local f = num(v[1], 1)
  local since = num(v[2], now)
  return math.min(1, f + math.max(0, now - since) * recover)
end

-- Make key live at least `seconds` more (never shortens): idle keys vanish.
local function keep(key, seconds)
  local ms = math.ceil(math.max(0, seconds) * 1000) + 1000
  local current = redis.call('PTTL', key)
  if current < ms then
    redis.call('PEXPIRE', key, ms)
  end
end
