"""The fleet client with no I/O: what both `Fleet` and `AsyncFleet` decide, written once.

- `identity`  where the fleet is, who the client is, the keys it signs with
- `messages`  requests built and validated, task messages signed, answers opened and
              decoded (typed errors), results judged (`CallNotRun`)
- `routing`   where a call goes, and which host owns an id, from looked-up data
- `watch`     when a call waited for is lost, when its host is dead, when to give up
- `events`    job events heard once and in order, across Redis restarts
- `records`   the keys and arguments of the scripts a client sends and withdraws
              calls with; how its reads parse
- `output`    a call's whole output (`run(output="full")`)
- `seal`      sealing what sessions store
- `constants` every timing, retry table and limit

Nothing here imports redis, celery or kombu, nor waits: the I/O layer
(`bashfleet.client._async`, and `bashfleet.client._sync` generated from it) reads and writes Redis
in the order these functions ask for, so both clients behave the same by construction.
"""
