"""A worker whose exec consumer holds thousands of descriptors loses no call: nothing in
its processes waits with select(2), which glibc aborts (`*** bit out of range 0 -
FD_SETSIZE on fd_set ***`, the whole consumer and every call it runs) for a descriptor
numbered 1024 or more.

What calls select() in the worker's processes, and how it was found: an LD_PRELOAD shim
whose select(), pselect() and __fdelt_chk() log a C and a Python backtrace, in every
process of the worker that keeps its environment (supervisor, both consumers), under
this module's 1,000 calls and under the interactive and network-policy suites;
`strace -f --seccomp-bpf -e trace=select,pselect6` over this module (the launcher,
keepers, guards and helpers too); `nm -D` of every shared object mapped in the exec
consumer; a grep of the virtualenv for `select.select(`, `SelectSelector`, `_select`:

- libnftables (`nft_run_cmd_from_buffer` -> select on its netlink socket, FD_SET
  fortified), loaded in the consumer through ctypes to load a workspace's rules: the one
  caller, and the one that aborts (`test_libnftables_aborts_past_fd_setsize`). It runs
  in the worker's nftables helper (`nft_helper`), a process of a few descriptors.
- Nothing else at run time. Statically: the select module (Python's own `select.select`
  raises ValueError past 1024, never aborts; no code a worker runs calls it: the engine,
  redis-py's hiredis parser, subprocess, multiprocessing and kombu's hub use poll or
  epoll), cryptography's Rust extension (OpenSSL's /dev/random wait, which checks
  `fd < FD_SETSIZE`, and runs only on kernels older than 4.8), readline, _tkinter and
  ossaudiodev (never loaded by a worker).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import redis
from privilege import needs_root

from bashfleet.client import AsyncFleet
from bashfleet.client.redis_server import RedisServer
from bashfleet.worker.engine import isolate
from bashfleet.worker.fleet import registry

from .conftest import WorkerFactory

pytestmark = needs_root("a root worker's networks")

#: Descriptors the exec consumer is made to hold from its start, at its lowest numbers:
#: every one a call opens is numbered past them, far past FD_SETSIZE (1024).
HELD = 3500
CALLS = 1000
SLOTS = 256

#: Made importable in the exec consumer only (PYTHONPATH), run by `site` at its start.
SITECUSTOMIZE = f"""
import os, resource

def _hold():
    with open("/proc/self/cmdline", "rb") as f:
        argv = f.read().split(b"\\0")
    if b"bashfleet.worker.fleet.consumer" not in argv or b"exec" not in argv:
        return []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 16384:
        resource.setrlimit(resource.RLIMIT_NOFILE, (16384, max(hard, 16384)))
    return [os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC) for _ in range({HELD})]

HELD = _hold()
"""

#: In a network namespace of its own: hold `argv[1]` descriptors, then load a ruleset
#: in this process (`in-process`) or through the worker's helper (`helper`).
LOADER = """
import os, sys
from bashfleet.worker.engine.isolate import kernel, nft_helper
held = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[1]))]
text = "add table inet probe\\ndelete table inet probe\\n"
if sys.argv[2] == "in-process":
    print(kernel.nft_run(kernel.nftables(), text))
else:
    helper = nft_helper.Helper()
    print(helper.load("/proc/self/ns/net", text))
    print(helper.load("/proc/self/ns/net", "no such command\\n").splitlines()[0])
    print(helper.load("/proc/self/ns/net", text))
    print("libnftables mapped:", "libnftables" in open("/proc/self/maps").read())
    helper.close()
"""


def _load_rules_holding(descriptors: int, where: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["unshare", "--net", sys.executable, "-c", LOADER, str(descriptors),
                           where], capture_output=True, text=True, timeout=60, check=False)


def test_libnftables_aborts_past_fd_setsize() -> None:
    """Why the library never runs in a worker process: a ruleset loaded by a process
    whose lowest free descriptor is past 1024 aborts it, however few it held a moment
    before."""
    assert _load_rules_holding(10, "in-process").returncode == 0
    done = _load_rules_holding(1100, "in-process")
    assert done.returncode == -6, done
    assert "bit out of range 0 - FD_SETSIZE on fd_set" in done.stderr


def test_the_helper_loads_rules_for_a_process_past_fd_setsize() -> None:
    done = _load_rules_holding(1100, "helper")
    assert done.returncode == 0, done.stderr
    # nft's own error for a bad ruleset, and the helper goes on serving.
    first, bad, then, mapped = done.stdout.splitlines()
    assert (first, then, mapped) == ("None", "None", "libnftables mapped: False")
    assert bad.startswith("Error: syntax error"), bad


class FdPeak:
    """The most descriptors process `pid` held while this ran (sampled every 50 ms)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            try:
                self.peak = max(self.peak, len(os.listdir(f"/proc/{self.pid}/fd")))
            except OSError:
                return

    def __enter__(self) -> FdPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


# 90 s of calls on a two-core machine at a load of 24, then the worker's stop.
@pytest.mark.timeout(300)
def test_a_thousand_calls_at_once_on_a_consumer_past_four_thousand_descriptors(
    redis_server: RedisServer, redis_client: redis.Redis, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    factory = WorkerFactory(redis_server.url, redis_client, tmp_path / "fleet")
    try:
        factory.start("many-fds", concurrency=SLOTS, env={"PYTHONPATH": str(site)})
        consumer = int(registry.host_record(redis_client, "many-fds")["exec_ready"])
        assert len(os.listdir(f"/proc/{consumer}/fd")) > HELD

        async def main() -> list[tuple[int | None, str]]:
            async with AsyncFleet(redis_server.url) as fleet:
                results = await asyncio.gather(*(
                    fleet.run(f"sleep 1; echo {i}", host="many-fds", timeout=300)
                    for i in range(CALLS)))
            return [(r.exit_code, r.stdout) for r in results]

        started = time.monotonic()
        with FdPeak(consumer) as descriptors:
            answers = asyncio.run(main())
        wall = time.monotonic() - started
        print(f"\n{CALLS} x `sleep 1` on one host of {SLOTS} slots: wall {wall:.1f}s, "
              f"the exec consumer's descriptors peaked at {descriptors.peak}")
        assert answers == [(0, f"{i}\n") for i in range(CALLS)]
        assert descriptors.peak > 4096
        # The same consumer answered them all; the workspaces' rules went through its
        # helper, and the library was never loaded in it (a count of descriptors looked
        # at before each ruleset loaded it here, and used it while the count was low).
        assert int(registry.host_record(redis_client, "many-fds")["exec_ready"]) == consumer
        assert any(isolate.runs(child.cmdline(), "nft_helper")
                   for child in psutil.Process(consumer).children())
        assert "libnftables" not in Path(f"/proc/{consumer}/maps").read_text()
    finally:
        factory.cleanup()
