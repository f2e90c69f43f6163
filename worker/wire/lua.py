"""Every Lua script of the fleet, as text: what each one moves in Redis, its KEYS and
ARGV, and what it returns. Both sides import it; nothing here runs a script.

Redis runs a script atomically, so a read-check-write is one round trip and needs no
WATCH retry loop: every call's own transitions are scripts. Who runs which:

- a client (`bashfleet.client._async.records` and its generated twin): SEND, WITHDRAW;
- a worker (`bashfleet.worker.fleet.registry`): CLAIM, UPDATE, FINISH, REPLY, RESTORE,
  SAVE_JOB, QUOTA_ACQUIRE, QUOTA_REFRESH.

Each runs wrapped in `bashfleet.worker.fleet.connect.Script`, which puts `PRELUDE` in
front of it and sends it with EVALSHA. A call's states and the script that moves each
(`bashfleet.worker.wire.names.CallState`)::

    (no record) --SEND--> queued --CLAIM--> running --FINISH--> done
    queued --WITHDRAW--> cancelled | abandoned
    cancelling | stopping | lost --FINISH--> cancelled | stopped | lost

(running -> cancelling, stopping or lost is a WATCH transaction:
`bashfleet.worker.fleet.registry.mark_call`.)

Conventions: the keys are built by `bashfleet.worker.wire.names`; every ARGV value
reaches Lua as a string; `fields...` at the end of an ARGV is a hash's fields as the flat
name, value, name, value... list HSET takes (None sent as ""). `KEYS[n]?` is a key the
caller may leave out; the script then skips what it is for.
"""

from __future__ import annotations

#: Put in front of every script. `unpack` is a global in Redis' Lua 5.1 and
#: `table.unpack` in later Luas (fakeredis' through lupa).
PRELUDE = "local unpack = unpack or table.unpack\n"

# ------------------------------------------------------------------------ the client

# SEND: record a call as queued and push its Celery message
# (`bashfleet.worker.wire.messages`), atomically: a call is never recorded without its
# message nor sent without its record, and a replica gets both or neither. An id its
# caller chose is checked unused; a fresh one (92 random bits, sent once: no path sends
# a call again) is not looked up.
# KEYS: [1] the call's record, [2] the queue, [3]? the named host's lock (the client
#   requires the host alive).
# ARGV: [1] call TTL (s), [2] the message, [3] '1': refuse an id in use ('': a fresh
#   id), [4...] fields.
# Returns 'ok'; 'down' when KEYS[3] is given and gone; 'taken' when the call id is in
# use. Nothing is recorded nor pushed unless 'ok'.
SEND = """
if KEYS[3] and redis.call('EXISTS', KEYS[3]) == 0 then return 'down' end
if ARGV[3] ~= '' and redis.call('EXISTS', KEYS[1]) == 1 then return 'taken' end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('LPUSH', KEYS[2], ARGV[2])
return 'ok'
"""

# WITHDRAW: move a queued call to a final state before any worker claims it (a cancel,
# or a client's watch giving the call up). The worker's CLAIM is the other side of this
# race, and a script too: one of the two wins, whole. A call without a record counts as
# queued (Redis lost it with its message in a failover, or its sender died before
# sending it): it is recorded withdrawn, so a message of it that turns up never runs.
# KEYS: [1] the call's record.
# ARGV: [1] the new state (cancelled, abandoned), [2] end time, [3] finished call's
#   TTL (s).
# Returns the state the call had ('queued' for no record); only 'queued' was moved.
WITHDRAW = """
local current = redis.call('HGET', KEYS[1], 'state') or 'queued'
if current == 'queued' then
  redis.call('HSET', KEYS[1], 'state', ARGV[1], 'ended_at', ARGV[2])
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return current
"""

# ------------------------------------------------------------------------ the worker

# CLAIM: mark a queued call running on this worker and take a busy slot for it. A
# signed message's nonce is recorded first: a replay claims nothing. A call in any
# state but queued is not claimed; one without a record (it expired, or Redis lost it)
# is claimed, and its record written again with the call TTL its sender gave it. The
# busy set's TTL is its heartbeat's to renew (its sentinel member keeps it: names).
# KEYS: [1] the call's record, [2] the host's busy set, [3]? the message's nonce.
# ARGV: [1] call TTL (s), [2] call id, [3] nonce TTL (ms), [4...] fields.
# Returns 'ok' (claimed); 'replayed' (the nonce was seen before); else the call's
# state, which forbids the claim.
CLAIM = """
if KEYS[3] and not redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[3]) then
  return 'replayed'
end
local state = redis.call('HGET', KEYS[1], 'state')
if state and state ~= 'queued' then return state end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
if not state then redis.call('EXPIRE', KEYS[1], ARGV[1]) end
redis.call('SADD', KEYS[2], ARGV[2])
return 'ok'
"""

# UPDATE: set fields of a call's record (pid, pgid, marker, spill...) without moving
# its state, and renew its TTL.
# KEYS: [1] the call's record.
# ARGV: [1] call TTL (s), [2...] fields.
# Returns the call's state after the update (nil when the record has none).
UPDATE = """
redis.call('HSET', KEYS[1], unpack(ARGV, 2))
redis.call('EXPIRE', KEYS[1], ARGV[1])
return redis.call('HGET', KEYS[1], 'state')
"""

# FINISH: record a call's end, free its busy slot and, in the same round trip, keep
# and publish its reply. The end state follows the state the call is in: cancelling ->
# cancelled, stopping -> stopped, lost stays lost, any other -> done. The reply is kept
# in the record's `reply` field (written by the same HSET: it expires with the record),
# or at KEYS[3] when given (a call that started a job, whose record outlives a reply).
# It is held back (not kept, not published) when the call ended from one of the states
# ARGV[7] lists: the worker amends it first and sends it with REPLY.
# KEYS: [1] the call's record, [2] the host's busy set, [3]? where the reply is kept
#   apart from the record.
# ARGV: [1] finished call's TTL (s), [2] call id (its exec task's id too), [3] end time,
#   [4] reply TTL (s) at KEYS[3], [5] reply channel ('' : keep only), [6] the reply
#   ('' : none to send), [7] the states that hold the reply back, space-separated,
#   [8...] fields.
# Returns {the state the call ended from ('' : no record), 1 when the reply was kept
# and published, else 0}. A published reply is `<task id>\n<reply>`.
FINISH = """
local current = redis.call('HGET', KEYS[1], 'state') or ''
local final = 'done'
if current == 'cancelling' then final = 'cancelled'
elseif current == 'stopping' then final = 'stopped'
elseif current == 'lost' then final = 'lost' end
local send = ARGV[6] ~= '' and
  not string.find(' ' .. ARGV[7] .. ' ', ' ' .. current .. ' ', 1, true)
if send and not KEYS[3] then
  redis.call('HSET', KEYS[1], 'state', final, 'ended_at', ARGV[3], 'reply', ARGV[6],
             unpack(ARGV, 8))
else
  redis.call('HSET', KEYS[1], 'state', final, 'ended_at', ARGV[3], unpack(ARGV, 8))
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
redis.call('SREM', KEYS[2], ARGV[2])
if not send then return {current, 0} end
if KEYS[3] then redis.call('SET', KEYS[3], ARGV[6], 'EX', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('PUBLISH', ARGV[5], ARGV[2] .. '\\n' .. ARGV[6]) end
return {current, 1}
"""

# REPLY: store a task's answer and publish it on its caller's channel.
# KEYS: [1] where the reply is stored.
# ARGV: [1] the reply, [2] reply TTL (s), [3] reply channel ('' : store only),
#   [4] task id.
# Returns 1. The message published is `<task id>\n<reply>`.
REPLY = """
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
if ARGV[3] ~= '' then redis.call('PUBLISH', ARGV[3], ARGV[4] .. '\\n' .. ARGV[1]) end
return 1
"""

# RESTORE: publish again a call this host runs, after Redis lost its record. Atomic
# against the call's own end: one whose end was recorded meanwhile (FINISH) stays as
# it is and takes no busy slot.
# KEYS: [1] the call's record, [2] the host's busy set.
# ARGV: [1] call TTL (s), [2] busy set TTL (s), [3] call id, [4...] fields.
# Returns the call's state afterwards ('running' for a record written again).
RESTORE = """
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
"""

# SAVE_JOB: publish a job's record and state, in its host's listing and its owner's,
# and on a transition its event (stream and channel): `started` the first time the job
# is published running, `ended` the first time it is published ended. Two processes
# that both see a job end publish one `ended` between them. With a quota key, the job's
# member is refreshed while it runs and removed once it ended (its owner's cap counts
# it: never refused here, the job exists; QUOTA_ACQUIRE refuses new starts).
# KEYS: [1] the job's hash, [2] the host's jobs, [3] the events stream, [4] the owner's
#   jobs on the host, [5]? the owner's job quota.
# ARGV: [1] job TTL (s), [2] job id, [3] start time (the listings' score), [4] events
#   kept (approximate MAXLEN), [5] events channel, [6] the started event, [7] the ended
#   event, [8] the new state (running, ended, unknown), [9] the job's quota member,
#   [10] quota TTL (ms), [11...] fields.
# Returns the event's stream id, or false when there was no transition. The message
# published is `<stream id>\n<event>`.
SAVE_JOB = """
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
"""

# QUOTA_ACQUIRE: take a place for a member in an owner's quota of one kind, unless the
# owner holds the limit of live members already. Expired members (of hosts that died)
# are dropped first; a member already held is refreshed, never refused. Expiries are
# in ms by Redis' own clock: hosts' clocks may differ.
# KEYS: [1] the owner's quota of the kind.
# ARGV: [1] member, [2] limit, [3] TTL (ms).
# Returns {1 taken / 0 refused, members held afterwards, ms until the soonest held
# member expires (0 when taken, or none is held)}.
QUOTA_ACQUIRE = """
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
"""

# QUOTA_REFRESH: renew members that are live (a host's pass over its jobs, a
# workspace's use), taking their place even past the limit: they exist. Expired members
# are dropped.
# KEYS: [1] the owner's quota of one kind.
# ARGV: [1] TTL (ms), [2...] members.
# Returns the members held afterwards.
QUOTA_REFRESH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
"""
