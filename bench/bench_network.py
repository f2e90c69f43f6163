"""Network benchmark: a workspace's own network namespace and its policy, against the
host's namespace measured in the same run.

    python -m bench.bench_network [--quick] [--dir D] [--count N]

Makes a network namespace with an HTTP server (the tests' `netns_helpers`: a veth pair
to the host, a documentation address, nothing leaves the machine), then, alternating the
sides run by run:

1. A 100 MB download (`curl` in a call) from that server in an `egress` workspace (its
   veth, its rules, the host's forwarding and masquerade) against the same download in
   a `host` workspace (the host's own namespace). Target: egress <= 1.10x host, median.
2. The same download in an `allow=` workspace (through its guard, by name): shown, no
   target (allow is for package indexes, not bulk data).
3. An `egress` workspace ready for its first call (`workspaces.create`: its link and
   rules made ahead with its blank keeper) against a `none` one. Target: p50 <= 10 ms.

Not a test: it never fails on a miss. Progress goes to stderr, the table to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from bashfleet.worker import Call, run_call
from bashfleet.worker.engine import sandbox, workspaces
from bashfleet.worker.engine.network import network
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import WorkspaceSpec
from bench.bench_containers import Row, _ms, _ok, _print, _say

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
# The tests' namespaces and servers: the one way to serve something "elsewhere" here.
from integration.netns_helpers import NetNs, make_netns

SIZE = 100 * 1000 * 1000
EGRESS_TARGET = 1.10
READY_TARGET_S = 0.010

def _download(settings: Settings, ws_id: str, url: str) -> float:
    """Seconds curl took for the whole body, in a call of the workspace."""
    result = run_call(Call(call_id=f"b{uuid.uuid4().hex[:15]}", workspace=ws_id,
                           command=f"curl -sS -o /dev/null -w '%{{time_total}} %{{size_download}}' "
                           f"{url}", timeout_s=120), settings=settings)
    seconds, size = result.stdout.split()
    if result.exit_code != 0 or int(size) != SIZE:
        raise RuntimeError(f"the download failed: {result.stdout} {result.stderr}")
    return float(seconds)


def download_rows(settings: Settings, net: NetNs, count: int) -> list[Row]:
    """Rows 1 and 2."""
    made = {policy: workspaces.create(WorkspaceSpec(network=policy), settings).id
            for policy in ("host", "egress", "allow=files.bench")}
    url = f"http://{net.ns_ip}:8080/big"
    times: dict[str, list[float]] = {policy: [] for policy in made}
    for index in range(count):
        order = list(made) if index % 2 else list(reversed(made))
        for policy in order:
            target = "http://files.bench/big" if policy.startswith("allow") else url
            times[policy].append(_download(settings, made[policy], target))
    host, egress = statistics.median(times["host"]), statistics.median(times["egress"])
    allow = statistics.median(times["allow=files.bench"])
    return [
        ("100 MB download, egress vs host", f"{egress * 1e3:.0f} ms ({egress / host:.2f}x)",
         f"{host * 1e3:.0f} ms (host)", f"<= {EGRESS_TARGET:.2f}x",
         _ok(egress / host <= EGRESS_TARGET)),
        ("100 MB download, allow (its guard) vs host", f"{allow * 1e3:.0f} ms "
         f"({allow / host:.2f}x)", f"{host * 1e3:.0f} ms (host)", "-", "-"),
    ]


def ready_rows(settings: Settings, count: int) -> list[Row]:
    """Row 3: made one after the other (the pool refills between), each deleted after."""
    times: dict[str, list[float]] = {"egress": [], "none": []}
    for index in range(count * 2):
        policy = "egress" if index % 2 else "none"
        started = time.perf_counter()
        record = workspaces.create(WorkspaceSpec(network=policy), settings)
        times[policy].append(time.perf_counter() - started)
        workspaces.delete(record.id, settings)
        time.sleep(0.05)  # the blanks' refill, as between an agent's workspaces
    return [("egress workspace ready for its first call", _ms(times["egress"]),
             _ms(times["none"]) + " (none)", f"<= {READY_TARGET_S * 1e3:.0f} ms p50",
             _ok(statistics.median(times["egress"]) <= READY_TARGET_S))]


@contextlib.contextmanager
def _state(base: Path, net: NetNs) -> Iterator[Settings]:
    settings = Settings(state_dir=base / "state", host="bench-network",
                        workspace_root=base / "workspaces", network_host_ok=True,
                        network_resolvers=(net.ns_ip,))
    try:
        yield settings
    finally:
        workspaces.throwaways.close()
        for record in workspaces.local_records(settings):
            workspaces.delete(record.id, settings)
        sandbox.close_all()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.bench_network", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer runs")
    parser.add_argument("--dir", type=Path, default=None, help="where its state goes")
    parser.add_argument("--count", type=int, default=None,
                        help="downloads per side (default 15; --quick 3)")
    args = parser.parse_args(argv)
    count = args.count or (3 if args.quick else 15)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-network-") as folder, \
            make_netns("198.51.100.0/24") as net:
        net.serve(http=[(net.ns_ip, 8080), (net.ns_ip, 80)], size=SIZE,
                  dns=(net.ns_ip, {"files.bench": net.ns_ip}))
        with _state(Path(folder), net) as settings:
            problem = network.support(settings)
            if problem is not None:
                _say(f"this host cannot filter workspaces' networks: {problem}")
                return 1
            _say(f"{count} downloads of {SIZE // 10**6} MB each way")
            rows = download_rows(settings, net, count)
            _say("workspaces made, egress and none")
            rows += ready_rows(settings, 5 if args.quick else 20)
    _print(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
