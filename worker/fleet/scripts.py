"""The worker's Lua scripts: the transitions every call makes, one round trip each.

Redis runs a script atomically, so a read-check-write needs no WATCH retry loop. The
client's own script (submit) lives on the client side (`bashfleet.client.records`).
"""

from __future__ import annotations

from bashfleet.worker.fleet.connect import Script

# KEYS: call, running[, nonce]; ARGV: call TTL, running TTL, call id, nonce TTL (ms),
# fields... A signed message's nonce is used first (a replay claims nothing); a call in
# any state but queued (or unknown: its record expired, or Redis lost it) is not claimed.
# The record keeps the TTL its sender gave it (CALL_TTL_S, longer than any call runs);
# one Redis lost is written again with that TTL.
CLAIM = Script("""
if KEYS[3] and not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[4]) then
  return 'replayed'
end
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'queued' then return state end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
if not state then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
redis.call('SADD', KEYS[2], ARGV[3])
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 'ok'
""")

# KEYS: call; ARGV: call TTL, fields... Returns the call's state after the update.
UPDATE = Script("""
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return redis.call('HGET', KEYS[1], 'state')
""")

# KEYS: call, running[, reply]; ARGV: finished call's TTL, call id, end time, reply TTL, reply
# channel, reply, states that hold the reply back, fields... Returns {the state the
# call ended from ('' : no record), 1 when the reply was stored and published}.
FINISH = Script("""
local current = redis.call('HGET', KEYS[1], 'state')
local final = 'done'
if current == 'cancelling' then final = 'cancelled'
elseif current == 'stopping' then final = 'stopped'
elseif current == 'lost' then final = 'lost' end
redis.call('HSET', KEYS[1], 'state', final, 'ended_at', ARGV[3], unpack(ARGV, 8))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[2], ARGV[2])
current = current or ''
if not KEYS[3] or string.find(' ' .. ARGV[7] .. ' ', ' ' .. current .. ' ', 1, true) then
  return {current, 0}
end
redis.call('SET', KEYS[3], ARGV[6], 'EX', ARGV[4])
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], ARGV[2] .. '\\n' .. ARGV[6]) end
return {current, 1}
""")

# KEYS: reply; ARGV: reply, reply TTL, channel, task id.
REPLY = Script("""
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\\n' .. ARGV[1]) end
return 1
""")

# KEYS: call, running; ARGV: call TTL, running TTL, call id, fields... Returns the
# call's state after it: a record Redis lost is written again as running; one whose
# end was recorded meanwhile (finish) is left as it is, and out of the busy set.
RESTORE = Script("""
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HSET', KEYS[1], 'state', 'running', unpack(ARGV, 4))
  redis.call('EXPIRE', KEYS[1], ARGV[1])
  state = 'running'
end
if state == 'running' or state == 'cancelling' or state == 'stopping' then
  redis.call('SADD', KEYS[2], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return state
""")

# KEYS: job, jobs of the host, events, the owner's jobs on the host[, owner's job quota];
# ARGV: job TTL, job id, start time, events kept, events channel, started event, ended
# event, new state, quota member, quota TTL (ms), fields... Publishes a job's state (in
# the host's listing and its owner's) and, on a transition, its event (stream +
# channel): `started` the first time the job is published running,
# `ended` the first time it is published ended. With a quota key, the job's member is
# refreshed while it runs and removed once it ended (its owner's cap counts it: never
# refused here, the job exists; `QUOTA_ACQUIRE` refuses new starts). Returns the
# event's stream id, or false when there was no transition.
SAVE_JOB = Script("""
local previous = redis.call('HGET', KEYS[1], 'state')
redis.call('HSET', KEYS[1], unpack(ARGV, 11))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[3], ARGV[2])
redis.call('EXPIRE', KEYS[4], ARGV[1])
if KEYS[5] then
  if ARGV[8] == 'ended' then
    redis.call('ZREM', KEYS[5], ARGV[9])
  elseif ARGV[8] == 'running' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', KEYS[5], now + tonumber(ARGV[10]), ARGV[9])
    redis.call('PEXPIRE', KEYS[5], ARGV[10])
  end
end
local event = false
if ARGV[8] == 'running' and not previous then event = ARGV[6]
elseif ARGV[8] == 'ended' and previous ~= 'ended' then event = ARGV[7] end
if not event then return false end
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'e', event)
redis.call('EXPIRE', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[5], id .. '\\n' .. event)
return id
""")

# KEYS: an owner's quota of one kind; ARGV: member, limit, TTL (ms). Takes a place for
# `member` unless the owner holds `limit` live members already (expired ones, of hosts
# that died, are dropped first; a member already held is refreshed, never refused).
# Redis' own clock: hosts' clocks may differ. Returns {1 taken / 0 refused, members
# held afterwards, ms until the soonest held member expires (0: none)}.
QUOTA_ACQUIRE = Script("""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
local count = redis.call('ZCARD', KEYS[1])
if not held and count >= tonumber(ARGV[2]) then
  local soonest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, count, soonest[2] and (tonumber(soonest[2]) - now) or 0}
end
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
if not held then count = count + 1 end
return {1, count, 0}
""")

# KEYS: an owner's quota of one kind; ARGV: TTL (ms), members... Refreshes members that
# are live (a host's pass over its jobs, a workspace's use), taking their place even past
# the limit: they exist. Returns the members held afterwards.
QUOTA_REFRESH = Script("""
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
""")
