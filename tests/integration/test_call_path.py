"""The hop budget of one call, traced in the real client and a real worker: the frames
from `Fleet.run` to the Redis push, the frames from the exec task to the keeper's
request, and the modules each process runs on the way. A path that grows past its budget
fails here, and the README's lines about the path are this trace's rendering."""

from __future__ import annotations

import os
from pathlib import Path

from bashfleet.client import Fleet
from bashfleet.client.redis_server import RedisServer

from . import call_trace
from .conftest import WorkerFactory, wait_for

#: Frames (the first included) from where a process takes the call to where it hands it on.
FRAME_BUDGET = 12
README = Path(__file__).parents[2] / "README.md"
#: The bashfleet modules each process's thread may enter for one call (the client's: a
#: call enters two parts of `Fleet`, its calls and the base they stand on; and two modules
#: of the wire's models, the call's and the base every model stands on).
CLIENT_MODULES = 18
WORKER_MODULES = 45


def test_one_call_stays_within_its_hop_and_module_budgets(
    workers: WorkerFactory, redis_server: RedisServer, tmp_path: Path
) -> None:
    folder = tmp_path / "trace"
    worker = workers.start(f"traced-{tmp_path.name[-6:]}", env=call_trace.worker_env(folder))
    with Fleet(redis_server.url) as fleet:
        workspace = fleet.workspace(host=worker.host)
        try:
            # The first call warms what is made once (the keeper's connection, caches).
            assert workspace.run("true").exit_code == 0
            with call_trace.traced_client("Calls.run", "send_call") as client:
                assert fleet.run("make --version >/dev/null || true",
                                 workspace=workspace.id).exit_code == 0
        finally:
            workspace.delete()
    wait_for(lambda: len(call_trace.worker_traces(folder)) >= 2, timeout=60,
             what="the traced worker's record of both calls")
    traces = call_trace.worker_traces(folder)
    worker_trace = traces[1]
    # The trace saw what it measures: one push, one keeper request, from their entry points.
    assert len(client.paths) == 1, client.paths
    assert client.paths[0][0] == "bashfleet.client._sync.calls:Calls.run", client.paths
    assert len(worker_trace["paths"]) == 1, worker_trace
    worker_path = worker_trace["paths"][0]
    assert worker_path[0].endswith("fleet.tasks:handle_exec"), worker_path
    assert worker_path[-1].endswith("engine.isolate.proto:send"), worker_path
    said = call_trace.path_lines(client.paths[0], worker_path)
    assert len(client.paths[0]) <= FRAME_BUDGET, said
    assert len(worker_path) <= FRAME_BUDGET, said
    assert len(client.modules) <= CLIENT_MODULES, (said, sorted(client.modules))
    assert len(worker_trace["modules"]) <= WORKER_MODULES, (said, worker_trace["modules"])
    # README's lines about the path are this trace's, and every module its table names
    # for the client or the worker ran for this call.
    text = README.read_text()
    if os.environ.get("WRITE_CALL_PATH") == "1":
        README.write_text(call_trace.with_block(text, said))
        text = README.read_text()
    assert call_trace.readme_block(text) == said, (
        "README's call path differs from the trace (WRITE_CALL_PATH=1 writes it):\n"
        + said)
    named = call_trace.table_modules(text)
    assert len(named["client"]) >= 4 and len(named["worker"]) >= 8, named
    assert named["client"] <= client.modules, named["client"] - client.modules
    assert named["worker"] <= set(worker_trace["modules"]), \
        named["worker"] - set(worker_trace["modules"])
