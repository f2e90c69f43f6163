"""The fleet's Redis users: what workers and clients may do, in one place.

Workers and clients are different Redis users (Redis 7 ACLs, with selectors):

- `bashfleet-worker` (workers, Flower, an operator's admin tools): every key and
  channel, every command. It writes what clients believe: job, host, workspace and
  snapshot records, events, quotas, nonces; it takes messages off the queues.
- `bashfleet-client` (every owner's client: the CLI, the Python API, MCP servers,
  framework integrations). One user for all owners: what keeps one owner's data from
  another is the owner keys (`bashfleet.worker.wire.owner_keys`: records locked per owner, ids
  in spaces no other owner can name); what this user adds is that a client cannot
  write, delete or forge what workers publish, nor read, take or drop what others
  queued. It may:
  - push a message onto a queue and count a queue's length (`LPUSH`, `LLEN`), never
    read, pop, trim or delete one (a message names its caller's reply channel);
  - write its own calls' records, their answers (forgetting one), its sessions and
    file transfers (`CLIENT_KEYS`), all named by ids other owners do not learn;
  - read, never write, what workers publish (`WORKER_KEYS`), and count a host's
    running calls (`SCARD`), never list them;
  - listen to reply channels and the events channel (never by pattern, never
    publish), run scripts (each command a script runs is checked as if sent);
  - never list keys (`KEYS`, `SCAN`), channels (`PUBSUB`), clients, nor read
    nonces, a host's full job list or Celery's own keys.

`acl_file` writes both users (and turns the default user off), for `bashfleet up`'s
Redis and for an operator's (`bashfleet redis-acl`, deploy/OPERATIONS.md).
"""

from __future__ import annotations

import hashlib

WORKER_USER = "bashfleet-worker"
CLIENT_USER = "bashfleet-client"

#: Keys a client writes: its calls' records and answers, its sessions' shells and
#: dialect states, its file transfers (`bashfleet.worker.wire.names`).
CLIENT_KEYS = (
    "bashfleet:call:*", "bashfleet:reply:*", "bashfleet:shell:*",
    "bashfleet:session-state:*", "bashfleet:transfer:*", "bashfleet:transfer-end:*",
)
#: Keys a client reads and never writes: what workers publish (sealed, and locked per
#: owner where they are one owner's), and the indexes of an owner's ids (its space's).
WORKER_KEYS = (
    "bashfleet:job:*", "bashfleet:host:*", "bashfleet:hosts", "bashfleet:alive:*",
    "bashfleet:events", "bashfleet:ws:*", "bashfleet:snap:*", "bashfleet:quota:*",
    "bashfleet:owner-jobs:*",
)
#: The queues (`bashfleet.<host>.exec`, `.ctl`, `bashfleet.any.exec`, pools).
QUEUES = "bashfleet.*"
#: A host's running calls (a set of call ids: counted, never listed).
RUNNING = "bashfleet:running:*"
#: Channels a client listens to: its replies (by a token of its own) and job events.
CHANNELS = ("bashfleet:replies:*", "bashfleet:events")

#: What a client may run on its own keys and (reads only) on the workers'.
CLIENT_COMMANDS = (
    # connecting
    "hello", "auth", "ping", "echo", "select", "reset", "quit",
    "client|setname", "client|getname", "client|id", "info",
    # strings and keys
    "get", "set", "mget", "del", "unlink", "exists", "expire", "pexpire", "ttl", "pttl",
    # hashes, lists, sets, sorted sets, streams
    "hget", "hgetall", "hmget", "hset", "rpush", "lpush", "llen", "blpop",
    "zrange", "zrangebyscore", "xrange", "xrevrange",
    # transactions and scripts
    "watch", "unwatch", "multi", "exec", "discard", "evalsha", "eval", "script|load",
    "script|exists",
    # replies and events
    "subscribe", "unsubscribe",
)


def client_rules() -> list[str]:
    """The ACL rules of the clients' user (after `on` and its password)."""
    rules = ["resetkeys", "resetchannels", "-@all"]
    rules += [f"+{command}" for command in CLIENT_COMMANDS]
    rules += [f"~{pattern}" for pattern in CLIENT_KEYS]
    rules += [f"%R~{pattern}" for pattern in WORKER_KEYS]
    rules += [f"&{channel}" for channel in CHANNELS]
    # Selectors: a command allowed with these keys only. A script may be started with
    # any keys (it does nothing by itself: each command it runs is checked as if the
    # client had sent it).
    rules += [f"(~{QUEUES} +lpush +llen)", f"(%R~{RUNNING} +scard)",
              "(~* +eval +evalsha)"]
    return rules


def worker_rules() -> list[str]:
    """The ACL rules of the workers' user: everything (Celery's keys included)."""
    return ["~*", "&*", "+@all"]


def _password_rule(password: str) -> str:
    """A password as an ACL file holds it: its SHA-256, never the password."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def user_line(user: str, password: str, rules: list[str]) -> str:
    """One `user` line of an ACL file (or of redis.conf)."""
    return " ".join(["user", user, "on", _password_rule(password), *rules])


def acl_lines(worker_password: str, client_password: str) -> list[str]:
    """The fleet's users, and the default user off (nobody connects without one)."""
    return [
        "user default off",
        user_line(WORKER_USER, worker_password, worker_rules()),
        user_line(CLIENT_USER, client_password, client_rules()),
    ]


def acl_file(worker_password: str, client_password: str) -> str:
    """An ACL file for the fleet's Redis (`aclfile`, or lines of redis.conf)."""
    return "\n".join(acl_lines(worker_password, client_password)) + "\n"


def setuser_args(user: str, password: str, rules: list[str]) -> list[str]:
    """`ACL SETUSER` arguments making `user` with `rules` (on a running server)."""
    return [user, "reset", "on", _password_rule(password), *rules]
