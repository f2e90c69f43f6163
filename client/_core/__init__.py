"""The fleet client with no I/O: what both `Fleet` and `AsyncFleet` decide, written once.

- `identity`  where the fleet is, who the client is, the keys it signs with
- `messages`  requests built and validated, task messages signed, answers opened and
              decoded (typed errors), results judged (`CallNotRun`)
- `sending`   what sending a call and opening its answer take, in the standard library
              alone (the CLI's plain `run` sends through it too, with no model built)
- `routing`   where a call goes, and which host owns an id, from looked-up data
- `watch`     when a call waited for is lost, when its host is dead, when to give up
- `events`    job events heard once and in order, across Redis restarts
- `records`   how a client's reads parse (the keys and arguments of the scripts it
              sends and withdraws calls with are `sending`'s)
- `output`    a call's whole output (`run(output="full")`)
- `seal`      sealing what sessions store
- `constants` every timing, retry table and limit

Nothing here imports redis, celery or kombu, nor waits: the I/O layer
(`bashfleet.client._async`, and `bashfleet.client._sync` generated from it) reads and writes Redis
in the order these functions ask for, so both clients behave the same by construction.
"""
