-- Admit every check at once, or none.  One call = one admission.
--
-- This file is a template: rateloop/admission/backends/scripts.py stitches its sections
-- (`--@name` lines) into one script per plan *shape* -- which scopes, which checks of
-- which kind on which field, which buckets follow the AIMD factor -- so the script runs
-- straight-line code with field names inlined: no plan to parse, no tables to build.
-- Numbers (amounts, allowances, rates) still come as arguments, so plans that differ
-- only in their limits share one script.  `$x` marks what the generator fills in: `$i`
-- a check's number, `$s` its scope's index, `$a` the index of its first argument,
-- `$F` its field, `$L`/`$T`/`$B` (`$C`/`$W`) where its fields are in the scope's HMGET
-- reply `v$s`.
--
-- KEYS: the state hash of each scope, then the lease set of each scope with a concurrency
--   limit (`$z`: a lease check's own): each counts only the leases held in its scope.
-- ARGV: recover_per_sec, book (the longest start ahead a booking may take, 0 for none),
--   [lease_id ('-' for none), when the plan has a lease], then per check 3 values:
--   amount, allowed, and its rate (bucket), reset offset (day) or lease TTL (lease).
-- Returns now (the server time in integer microseconds) when granted; {1, now, starts_in,
-- refused} when booked (only bucket levels made it wait, at most `book` seconds: the
-- buckets are charged now and the call starts later); else
-- {0, now, wait, scope_index, field, never_fits, paused, pause_reason, refused}.
-- A borrowing script (a lease) takes one more argument, the most it borrows, and answers
-- {3, now, k, refused} when it borrowed k more calls' worth.
-- refused (' index until' for each scope whose 'e' is after now, '' for none): a refusal
-- (a pause, a 429 observed) said the provider has nothing in *that* scope before then --
-- a granted call gets {2, now, refused} while one is in force, so a process learns other
-- processes' refusals with its admissions (a start it booked before that time in that
-- scope is void).  Each stays with its scope: a project's pause is not its model's.
--
-- Each scope's hash is read with one HMGET (only its pause when nothing of it is
-- written) and written with one HSET; its TTL is set only when the state would outlive
-- it (see extend in _common.lua).  The AIMD start 'fs' and a pause's reason are read
-- only when they matter.

--@head
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now = now_us / 1000000
-- ARGV[1] (recover_per_sec) and ARGV[2] (book) are parsed where used: rarely.
-- the longest wait; `hard`: the longest a booking cannot cover (pause, day, lease, block)
local wait, hard, why, why_field, paused = 0, 0, 0, '', 0
local ru = ''  -- ' index until' of each scope whose 'e' (refused until) is in force

--@lease_id
local lease_id = ARGV[3]

--@args
local am$i, al$i, r$i = tonumber(ARGV[$a]), tonumber(ARGV[$a + 1]), tonumber(ARGV[$a + 2])
if am$i > al$i then return {0, now_us, '0', $s, '$F', 1, 0, ''} end

--@read
-- scope $s: its pause, expiry, AIMD factor and the fields of its checks
local k$s = KEYS[$s]
local v$s = redis.call('HMGET', k$s, 'p', 'x', 'f', 'e'$fields)
if v$s[4] and tonumber(v$s[4]) > now then ru = ru .. ' $s ' .. v$s[4] end
local f$s = 1
if v$s[3] then f$s = factor_of(v$s[3], redis.call('HGET', k$s, 'fs'), now, tonumber(ARGV[1])) end
if v$s[1] then
  local u = tonumber(v$s[1]) - now
  if u > wait then wait, hard, why, why_field, paused = u, u, $s, '', 1 end
end

--@read_pause
-- scope $s: only its pause and refusal (none of its checks writes the hash)
do
  local pe = redis.call('HMGET', KEYS[$s], 'p', 'e')
  local p = pe[1]
  if pe[2] and tonumber(pe[2]) > now then ru = ru .. ' $s ' .. pe[2] end
  if p then
    local u = tonumber(p) - now
    if u > wait then wait, hard, why, why_field, paused = u, u, $s, '', 1 end
  end
end

--@bucket
-- check $i: bucket '$F' of scope $s.  Booked ahead, it holds its level at its last
-- start (ts > now): a call starts after it.  lv$i is the level at ba$i.
$scale
local ts$i = num(v$s[$T], now)
local ba$i = math.max(ts$i, now)
local lv$i = drained(num(v$s[$L], 0), ts$i, ba$i, r$i)
local bl$i = num(v$s[$B], 0)
do
  local w = ba$i - now
  local over = lv$i + am$i - al$i
  if over > 0 then w = w + over / r$i end
  hard = math.max(hard, bl$i - now)
  w = math.max(w, bl$i - now)
  if w > wait then wait, why, why_field, paused = w, $s, '$F', 0 end
end

--@day
-- check $i: day window '$F' of scope $s (r$i: its reset offset)
local ix$i, fi$i = day_window(now, r$i)
local n$i = 0
if num(v$s[$W], nil) == ix$i then n$i = num(v$s[$C], 0) end
local bl$i = num(v$s[$B], 0)
do
  local w = 0
  if n$i + am$i > al$i then w = fi$i - now end
  w = math.max(w, bl$i - now)
  hard = math.max(hard, w)
  if w > wait then wait, why, why_field, paused = w, $s, '$F', 0 end
end

--@lease
-- check $i: concurrency leases of scope $s, in its own set KEYS[$z] (r$i: the lease TTL)
local zc$i = 0
do
  local z = KEYS[$z]
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now_text(t))
  local w = 0
  zc$i = redis.call('ZCARD', z)
  if zc$i + 1 > al$i then
    local first = redis.call('ZRANGE', z, 0, 0, 'WITHSCORES')
    w = math.max(math.min(tonumber(first[2]) - now, $poll), 0.000001)
    hard = math.max(hard, w)
  end
  if w > wait then wait, why, why_field, paused = w, $s, '$F', 0 end
end

--@decide
if wait > 0 and (hard > 0 or wait > tonumber(ARGV[2])) then
  local reason = ''
  if paused == 1 then reason = redis.call('HGET', KEYS[why], 'pr') or '' end
  return {0, now_us, fmt(wait), why, why_field, 0, paused, reason, ru}
end
-- Booked (wait > 0): each bucket is charged at the start, now + wait.  Not booked, the
-- start is now, written from TIME's digits (the same number, no formatting).
local at, at_s = now, nil
if wait > 0 then at = now + wait; at_s = fmt(at) else at_s = now_text(t) end

--@borrow_open
-- Borrowing (a local lease, rateloop/admission/lease.py): a call granted now also takes k
-- more of its amounts on every bucket, k whole and at most ARGV[$m], as lease_calls allows
-- on each.  Booked (wait > 0), it borrows nothing.
local k = 0
if wait == 0 then
  k = tonumber(ARGV[$m])

--@borrow_check
  k = math.min(k, lease_calls(lv$i + am$i, al$i, am$i))

--@borrow_none
  k = 0  -- check $i is no bucket: nothing is borrowed

--@borrow_take
  if k < 1 then k = 0 end
  if k > 0 then
$more
  end
end

--@write_open
-- write scope $s
do
  local ttl = 0
  if f$s < 1 then ttl = (1 - f$s) / tonumber(ARGV[1]) end

--@write_bucket
  local level$i = math.max(0, lv$i - (at - ba$i) * r$i) + am$i
  ttl = math.max(ttl, at - now + level$i / r$i, bl$i - now)
  level$i = fmt(level$i)

--@write_day
  ttl = math.max(ttl, fi$i - now, bl$i - now)

--@write_close
  write_state(k$s, v$s[2], now, ttl$pairs)
end

--@write_lease
-- the lease, held in scope $s's set until settled (or its TTL, r$i, passes)
if lease_id ~= '-' then
  local z = KEYS[$z]
  redis.call('ZADD', z, fmt(now + r$i), lease_id)
  keep(z, r$i)
end

--@hist
-- the history of scope $s (rateloop/admission/history.py): one admission, its units and
-- the limits in force
history(KEYS[$h], now, {'+', 'a', 1$ops}, $keep)

--@borrow_reply
if k > 0 then return {3, now_us, k, ru} end

--@reply
if wait > 0 then return {1, now_us, fmt(wait), ru} end
if ru ~= '' then return {2, now_us, ru} end
return now_us
