"""`bashfleet owner add NAME` and `bashfleet redis-acl`: an operator's commands.

    bashfleet owner add team-a            # its key, on stdout
    bashfleet owner add team-a --env      # BASHFLEET_OWNER_KEY=... (and a local fleet's
                                          # BASHFLEET_REDIS_URL for clients)
    bashfleet redis-acl --worker-password-file w --client-password-file c > users.acl

An owner key is derived from the fleet's key (`bashfleet.worker.wire.owner_keys`): printing one
changes nothing anywhere, and needs the fleet key (BASHFLEET_SIGNING_KEY, or the local
fleet's, read from `bashfleet up`'s state by whoever started it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

#: Exit status of a usage error (as `bashfleet.client.cli`'s).
EXIT_USAGE = 2


def _fleet_key() -> tuple[str | None, str | None]:
    """(the fleet key, the clients' Redis URL of a local fleet, if any)."""
    from bashfleet.client import local  # noqa: PLC0415 - CLI side only
    from bashfleet.worker.settings import Settings  # noqa: PLC0415
    from bashfleet.worker.wire.owner_keys import is_owner_key  # noqa: PLC0415

    settings = Settings()
    state = local.running_state()
    key = settings.signing_key.get_secret_value() if settings.signing_key else None
    if key is not None and is_owner_key(key):
        return None, None
    if key is None and state is not None:
        key = state.signing_key
    # A local fleet's clients' URL, when that fleet signs with this key.
    ours = state is not None and key is not None and state.signing_key == key
    return key, state.client_redis_url if ours and state is not None else None


def cmd_owner_add(args: argparse.Namespace) -> int:
    from bashfleet.worker.wire.owner_keys import OWNER_NAME_RE, SUB_OWNER, OwnerKey  # noqa: PLC0415

    name = str(args.name)
    if not re.fullmatch(OWNER_NAME_RE, name) or SUB_OWNER in name:
        print(f"bashfleet owner add: invalid owner {name!r}: 1-64 letters, digits or "
              "_ . : @ -, without '::'", file=sys.stderr)
        return EXIT_USAGE
    fleet_key, client_url = _fleet_key()
    if fleet_key is None:
        print("bashfleet owner add: needs the fleet's key: set BASHFLEET_SIGNING_KEY to it "
              "(an owner key cannot issue keys), or run it as whoever ran `bashfleet up`",
              file=sys.stderr)
        return EXIT_USAGE
    key = OwnerKey.issue(fleet_key, name).text
    if args.env:
        print(f"BASHFLEET_OWNER_KEY={key}")
        if client_url:
            print(f"BASHFLEET_REDIS_URL={client_url}")
    else:
        print(key)
    print(f"bashfleet owner add: the key of owner {name}: a client holding it (as "
          "BASHFLEET_OWNER_KEY) acts as that owner only. Keep it secret; rotating the fleet "
          "key revokes it.", file=sys.stderr)
    return 0


def cmd_redis_acl(args: argparse.Namespace) -> int:
    from bashfleet.worker.wire import acl  # noqa: PLC0415

    try:
        worker = Path(args.worker_password_file).read_text(encoding="utf-8").strip()
        client = Path(args.client_password_file).read_text(encoding="utf-8").strip()
    except OSError as exc:
        print(f"bashfleet redis-acl: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not worker or not client or worker == client:
        print("bashfleet redis-acl: two passwords, different and not empty", file=sys.stderr)
        return EXIT_USAGE
    sys.stdout.write(acl.acl_file(worker, client))
    return 0
