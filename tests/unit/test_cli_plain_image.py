"""`bashfleet run --image`'s light path says its control requests as the fleet client
does: each request it sends is the model's dump of the same arguments, a reply is read
as the fleet client reads it, and what it cannot do is left to the fleet client's path
before anything is sent."""

from __future__ import annotations

import argparse
import base64
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bashfleet.client import exit_status
from bashfleet.client._core.identity import Identity
from bashfleet.client._core.messages import control_message, control_request, decode_control
from bashfleet.client._core.sending import control_reply, new_task_id
from bashfleet.client.cli import arguments, plain_image, run
from bashfleet.client.errors import CallRejected, UnknownJob, WorkerError
from bashfleet.client.foreground import Interrupts
from bashfleet.worker.fleet import workspace_calls
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire import auth
from bashfleet.worker.wire.control import (
    JobsRequest,
    WorkspaceCreateRequest,
    WorkspaceDeleted,
    WorkspaceDeleteRequest,
)
from bashfleet.worker.wire.errors import ToolError
from bashfleet.worker.wire.messages import iso_utc
from bashfleet.worker.wire.models import WorkspaceLimits, WorkspaceSpec

OWNER = "user:alice"
WS = "w0123456789abcde"
TTL = run.RUN_IMAGE_TTL_S


def _args(*argv: str) -> argparse.Namespace:
    parsed, rest = arguments.build_parser(["run"]).parse_known_args(["run", *argv])
    assert rest == []
    return parsed


def _models_create(args: argparse.Namespace, owner: str = OWNER) -> dict[str, Any]:
    """What the fleet client's `workspace(image=..., isolation=..., ttl_s=...)` sends for
    the same arguments (its spec, as `_new_workspace` lays it out), asked not to pull."""
    spec = {"path": None, "ttl_s": TTL, "isolation": args.isolation, "network": None,
            "limits": {}, "mounts": {}, "tags": {}, "near": None, "session": None,
            "image": args.image, "user": None, "build": None, "build_network": None,
            "snapshot": None}
    request = WorkspaceCreateRequest(spec=spec, pull=False, owner=owner)
    dumped: dict[str, Any] = request.model_dump(mode="json")
    return dumped


LIGHT = [
    ["--image", "debian:12", "true"],
    ["--image", "127.0.0.1:5000/bashfleet/debian:bookworm", "echo", "a b"],
    ["--image", "python:3.12-slim", "--host", "h1", "--isolation", "strict", "id"],
    ["--image", "reg.example:5000/app@sha256:" + "0" * 64, "--isolation", "process", "ls"],
    ["--image", "alpine", "--isolation", "none", "--cwd", "/tmp", "--timeout", "3", "pwd"],
    ["--image", "x" * plain_image.MAX_IMAGE_REF, "true"],
    ["--image", "debian:12", "--mode", "slow", "make"],
    ["--image", "debian:12", "--background-on-timeout", "--timeout", "1", "sleep 5"],
]


@pytest.mark.parametrize("argv", LIGHT)
def test_the_create_request_is_the_models_dump(argv: list[str]) -> None:
    args = _args(*argv)
    assert plain_image.is_light(args)
    assert plain_image.create_data(args, owner=OWNER, ttl_s=TTL) == _models_create(args)


@pytest.mark.parametrize("owner", ["user:alice", "team::0", "session:s1", "a.b-c_d"])
def test_the_delete_and_jobs_requests_are_the_models_dumps(owner: str) -> None:
    assert plain_image.delete_data(WS, owner=owner) == WorkspaceDeleteRequest(
        id=WS, owner=owner).model_dump(mode="json")
    assert plain_image.jobs_data(WS, owner=owner) == JobsRequest(
        workspace=WS, owner=owner).model_dump(mode="json")


def test_the_light_path_holds_the_wires_limits() -> None:
    assert _max_length(WorkspaceSpec, "image") == plain_image.MAX_IMAGE_REF
    assert WorkspaceLimits().model_dump(mode="json") == plain_image.NO_LIMITS
    assert WorkspaceCreateRequest().pull is True  # the fleet client's own creates pull


def _max_length(model: Any, name: str) -> int:
    found = [getattr(item, "max_length", None) for item in model.model_fields[name].metadata]
    return int(next(value for value in found if value is not None))


#: What the light path leaves to the fleet client's path, nothing sent: what it does
#: not do, and calls that are not plain.
NOT_LIGHT = [
    ["--build", "ctx", "true"],
    ["--image", "debian:12", "--user", "nobody", "true"],
    ["--image", "debian:12", "--network", "none", "true"],
    ["--image", "debian:12", "--no-network", "true"],
    ["--image", "debian:12", "--build-network", "none", "true"],
    ["--image", "debian:12", "--json", "true"],
    ["--image", "debian:12", "--follow", "true"],
    ["--image", "debian:12", "--session", "s1", "true"],
    ["--image", "debian:12", "--tag", "a=b", "true"],
    ["--image", "debian:12", "--mode", "background", "true"],
    ["--image", "debian:12", "--tty", "true"],
    ["--image", "debian:12", "--workspace", WS, "true"],
    ["true"],
]


@pytest.mark.parametrize("argv", NOT_LIGHT)
def test_what_the_light_path_does_not_do_goes_to_the_fleet_client(argv: list[str]) -> None:
    assert not plain_image.is_light(_args(*argv))


def test_an_image_past_the_wires_limit_is_left_to_the_fleet_client() -> None:
    image = "x" * (plain_image.MAX_IMAGE_REF + 1)
    assert plain_image.create_data(_args("--image", image, "true"), owner=OWNER,
                                   ttl_s=TTL) is None
    with pytest.raises(CallRejected):  # which says why
        control_request(WorkspaceCreateRequest, spec={"image": image}, owner=OWNER)


@pytest.mark.parametrize("image", ["debian\x00:12", "debian\udcff"])
def test_an_image_no_reference_can_be_is_left_to_the_fleet_client(image: str) -> None:
    """A NUL byte or a lone surrogate (which no JSON text carries): the fleet client's
    path sends it, and the host refuses it in its words."""
    assert plain_image.create_data(_args("--image", image, "true"), owner=OWNER,
                                   ttl_s=TTL) is None


def test_an_owner_the_models_refuse_is_left_to_the_fleet_client() -> None:
    assert plain_image.create_data(_args("--image", "debian:12", "true"), owner="a b",
                                   ttl_s=TTL) is None


def test_piped_stdin_goes_to_the_fleet_client(tmp_path: Path) -> None:
    data = tmp_path / "in"
    data.write_text("x")
    saved = os.dup(0)
    try:
        with open(data) as piped:
            os.dup2(piped.fileno(), 0)
            assert not plain_image.is_light(_args("--image", "debian:12", "cat"))
            assert plain_image.is_light(_args("--image", "debian:12", "--no-stdin", "cat"))
    finally:
        os.dup2(saved, 0)
        os.close(saved)


# ------------------------------------------------------------------------- replies

KEY = "k" * 32
IDENTITY = Identity(owner=OWNER, signing_key=KEY, admin=False, shell_key=KEY,
                    verifying_keys=(KEY,))


def _sealed(task_id: str, reply: Any) -> str:
    return auth.lock([KEY], auth.REPLY, task_id, json.dumps(reply))


REPLIES = [
    {"ok": {"id": WS, "deleted": True}},
    {"ok": {"id": WS, "deleted": False}, "error": None},
    {"error": {"kind": "not_found", "message": "no such workspace", "file": None}},
    {"error": {"kind": "invalid", "message": "bad", "file": None}, "ok": None},
]


@pytest.mark.parametrize("reply", REPLIES)
def test_a_reply_reads_as_the_fleet_client_reads_it(reply: dict[str, Any]) -> None:
    task_id = new_task_id()
    data = control_reply(IDENTITY.reply_keys(), task_id, "h1", _sealed(task_id, reply))
    assert data == reply
    try:
        model: Any = decode_control(IDENTITY.reply_keys(), task_id, "h1",
                                    _sealed(task_id, reply), WorkspaceDeleted)
    except (UnknownJob, CallRejected) as exc:
        assert data["error"]["message"] == str(exc)
    else:
        assert data["ok"] == model.model_dump(mode="json")


@pytest.mark.parametrize("text", ["[1]", "not json", '{"ok": 3}', '{"other": {}}'])
def test_a_reply_that_is_not_one_is_a_worker_error(text: str) -> None:
    task_id = new_task_id()
    sealed = auth.lock([KEY], auth.REPLY, task_id, text)
    with pytest.raises(WorkerError, match="the worker on h1 answered"):
        control_reply(IDENTITY.reply_keys(), task_id, "h1", sealed)
    with pytest.raises(WorkerError, match="the worker on h1 answered"):
        decode_control(IDENTITY.reply_keys(), task_id, "h1", sealed, WorkspaceDeleted)


def test_the_light_control_message_is_the_fleet_clients() -> None:
    """A control message built from the request's data carries what the model's does:
    the same task, queue, expiry and arguments (signed apart: each has its nonce)."""
    request = WorkspaceDeleteRequest(id=WS)
    by_model = json.loads(control_message(IDENTITY, request, task_id="t1", host="h1",
                                          reply_to="r", timeout=30.0))
    assert by_model["headers"]["task"] == request.task
    assert by_model["headers"]["argsrepr"] == repr(WS)
    assert by_model["headers"]["expires"] is not None
    body = json.loads(base64.b64decode(by_model["body"]))
    assert body[0][0]["args"] == [plain_image.delete_data(WS, owner=OWNER)]


@pytest.mark.parametrize("timestamp", [
    0.0, 1.5, 1e9, 1893553475.0, 1893553475.999999, 1893553475.0000005, 1893553475.9999995,
    1893553475.9999996, 3985833339.8982887, 1129964902.0645885, 4102444799.999999,
])
def test_an_expiry_reads_as_datetime_writes_it(timestamp: float) -> None:
    assert iso_utc(timestamp) == datetime.fromtimestamp(timestamp, UTC).isoformat()


@given(st.floats(min_value=0, max_value=4102444799.0))
def test_any_expiry_reads_as_datetime_writes_it(timestamp: float) -> None:
    assert iso_utc(timestamp) == datetime.fromtimestamp(timestamp, UTC).isoformat()


@pytest.mark.parametrize(("reply", "made"), [
    ({"ok": {"id": WS, "host": "h1"}}, WS),
    ({"ok": None, "error": {"kind": "not_found", "message": "not held"}}, None),
    ({"error": {"kind": "limit", "message": "cap"}}, None),
])
def test_a_create_reply_says_what_was_made(reply: dict[str, Any], made: str | None) -> None:
    assert plain_image.made_id(reply, "h1") == made


@pytest.mark.parametrize("reply", [{"ok": {}}, {"ok": {"id": "../x"}}, {"ok": {"id": 3}}])
def test_a_create_reply_that_names_no_workspace_is_a_worker_error(
        reply: dict[str, Any]) -> None:
    with pytest.raises(WorkerError):
        plain_image.made_id(reply, "h1")


@pytest.mark.parametrize(("sigint", "sigterm", "status"), [
    (0, False, None), (1, False, exit_status.INTERRUPTED), (2, False, exit_status.INTERRUPTED),
    (0, True, exit_status.TERMINATED), (1, True, exit_status.TERMINATED),
])
def test_an_interrupt_while_the_workspace_is_made_asks_for_its_status(
        sigint: int, sigterm: bool, status: int | None) -> None:
    assert plain_image.interrupted_status(Interrupts(sigint, sigterm=sigterm)) == status


def test_the_stays_notice_names_the_workspace_and_how_to_end_it() -> None:
    assert run.stays_notice(WS) == (f"[workspace {WS} stays while its job runs; "
                                    f"`bashfleet workspace rm {WS}` ends it]")


# --------------------------------------------------------------------- the worker


def test_a_create_that_may_not_pull_is_refused_for_an_image_not_held(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", host="h1")
    with pytest.raises(ToolError) as refused:
        workspace_calls._require_held(settings, "debian:12")
    assert refused.value.kind == "not_found" and "not held on host h1" in refused.value.message
    with pytest.raises(ToolError) as bad:
        workspace_calls._require_held(settings, "Not A Ref!")
    assert bad.value.kind == "invalid"
