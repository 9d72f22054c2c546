-- Give back a lease's unused units (rateloop/admission/lease.py): each bucket's level goes
-- down by what of them cannot have drained since they were borrowed -- at least
-- borrowed - rate * (at - since) of them are still in it -- so a bucket never holds less
-- than it would had they never been borrowed (gcra.py's returnable).
-- KEYS: the state hash of each scope, then (when the history is kept) each one's history
--   base, in the same order.
-- ARGV: recover_per_sec, since (server time the lease was charged), history (1: kept),
--   history TTL, then per bucket 6 values: scope index (in KEYS), field, rate, scaled
--   (1: follows the AIMD factor), borrowed, left.
-- Returns {now, given back per bucket...}.
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = now_us / 1000000
local recover, since = tonumber(ARGV[1]), tonumber(ARGV[2])
local nscopes = #KEYS
if ARGV[3] == '1' then nscopes = #KEYS / 2 end
local out = {now_us}
for a = 5, #ARGV, 6 do
  local s, field, rate = tonumber(ARGV[a]), ARGV[a + 1], tonumber(ARGV[a + 2])
  local borrowed, left = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local k = KEYS[s]
  local v = redis.call('HMGET', k, 'x', field .. ':l', field .. ':t')
  local back = 0
  if v[2] then
    local r = rate
    if ARGV[a + 3] == '1' then r = rate * factor_at(k, now, recover) end
    local ts = num(v[3], now)
    local at = math.max(ts, now)
    local level = drained(num(v[2], 0), ts, at, r)
    back = math.min(level, left, math.max(0, borrowed - rate * (at - since)))
    level = level - back
    local at_s = fmt(at)
    if at == now then at_s = now_text(t) end
    write_state(k, v[1], now, at - now + level / r, field .. ':l', fmt(level), field .. ':t', at_s)
    if back > 0 and ARGV[3] == '1' then
      history(KEYS[nscopes + s], now, {'+', 'u:' .. field, -back}, tonumber(ARGV[4]))
    end
  end
  out[#out + 1] = fmt(back)
end
return out
