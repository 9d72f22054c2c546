-- Settle a reservation: change bucket levels by the deltas, release the lease.
--
-- A template like admit.lua: rateloop/admission/backends/scripts.py makes one script per
-- settle shape (which buckets of which scopes, whether they follow the AIMD factor,
-- which lease sets hold its lease), reading and writing each scope's hash once.  `$j` is
-- an adjustment's number, `$s` its scope's index, `$a` its first argument, `$F` its
-- field, `$L`/`$T` where its fields are in the scope's HMGET reply, `$z` a lease set's
-- index in KEYS.
--
-- KEYS: the state hash of each scope, then the lease set of each scope with a concurrency
--   limit: the lease is removed from every one (`$z`), as it was added to every one.
-- ARGV: recover_per_sec, starts_at (the reservation's start, server time), lease_id,
--   then per adjustment 2 values: rate, delta.
-- Returns the server time in integer microseconds, or {now, refused} while a refusal
-- recorded in a settled scope ('e', see admit.lua) is in force: ' index until' per scope.

--@head
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = now_us / 1000000
local since = math.max(now, tonumber(ARGV[2]))
local ru = ''

--@read
-- scope $s: expiry, AIMD factor and the buckets settled
local k$s = KEYS[$s]
local v$s = redis.call('HMGET', k$s, 'x', 'f', 'e'$fields)
if v$s[3] and tonumber(v$s[3]) > now then ru = ru .. ' $s ' .. v$s[3] end
local f$s = 1
if v$s[2] then f$s = factor_of(v$s[2], redis.call('HGET', k$s, 'fs'), now, tonumber(ARGV[1])) end
local ttl$s = 0

--@adjust
-- bucket '$F' of scope $s.  Booked ahead (its ts after now), it holds its level at its
-- last start: a refund lowers it by at most what would not have drained between the
-- reservation's own start (or now) and then.
local at$j, level$j
do
  local rate = tonumber(ARGV[$a])$scale
  local ts = num(v$s[$T], now)
  local at = math.max(ts, now)
  local delta = tonumber(ARGV[$a + 1])
  if ts > now and delta < 0 then delta = math.min(0, delta + math.max(0, ts - since) * rate) end
  local level = math.max(0, drained(num(v$s[$L], 0), ts, at, rate) + delta)
  ttl$s = math.max(ttl$s, at - now + level / rate)
  level$j = fmt(level)
  if at == now then at$j = now_text(t) else at$j = fmt(at) end
end

--@write
write_state(k$s, v$s[1], now, ttl$s$pairs)

--@lease
redis.call('ZREM', KEYS[$z], ARGV[3])

--@hist
-- the history of scope $s (rateloop/admission/history.py): bucket '$F' settled by its delta
if tonumber(ARGV[$a + 1]) ~= 0 then history(KEYS[$h], now, {'+', 'u:$F', ARGV[$a + 1]}, $keep) end

--@reply
if ru ~= '' then return {now_us, ru} end
return now_us
