"""The worker's Lua scripts: the transitions every call makes, one round trip each.

Redis runs a script atomically, so a read-check-write needs no WATCH retry loop. The
client's own script (submit) lives on the client side (`client.records`).
"""

from __future__ import annotations

from worker.fleet.connect import Script

# KEYS: call, running[, nonce]; ARGV: call TTL, running TTL, call id, nonce TTL (ms),
# fields... A signed message's nonce is used first (a replay claims nothing); a call in
# any state but queued (or unknown: its record expired, or Redis lost it) is not claimed.
CLAIM = Script("""
if KEYS[3] and not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[4]) then
  return 'replayed'
end
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'queued' then return state end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('EXPIRE', KEYS[1], ARGV[1])
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

# KEYS: call, running[, reply]; ARGV: call TTL, call id, end time, reply TTL, reply
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

# KEYS: job, jobs of the host, events; ARGV: job TTL, job id, start time, events kept,
# events channel, started event, ended event, new state, fields... Publishes a job's
# state and, on a transition, its event (stream + channel): `started` the first time
# the job is published running, `ended` the first time it is published ended. Returns
# the event's stream id, or false when there was no transition.
SAVE_JOB = Script("""
local previous = redis.call('HGET', KEYS[1], 'state')
redis.call('HSET', KEYS[1], unpack(ARGV, 9))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('EXPIRE', KEYS[2], ARGV[1])
local event = false
if ARGV[8] == 'running' and not previous then event = ARGV[6]
elseif ARGV[8] == 'ended' and previous ~= 'ended' then event = ARGV[7] end
if not event then return false end
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', 'e', event)
redis.call('EXPIRE', KEYS[3], ARGV[1])
redis.call('PUBLISH', ARGV[5], id .. '\\n' .. event)
return id
""")
