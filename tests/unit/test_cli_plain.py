"""`bashfleet run`'s plain path says a call as the fleet client does: the JSON it sends
is the models' dump of the same arguments, what it cannot check it leaves to the
fleet client, and a result prints (stdout, stderr, exit status) byte for byte as the
model's does."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.client import exit_status
from bashfleet.client._core.messages import build_call
from bashfleet.client._core.sending import new_call_id
from bashfleet.client.cli import arguments, plain, run
from bashfleet.client.errors import CallRejected, WorkerError
from bashfleet.worker.wire import auth, models, names
from bashfleet.worker.wire.messages import random_uuid
from bashfleet.worker.wire.models import (
    CallResult,
    JobHandle,
    Policy,
    Spill,
    SystemError_,
    TruncationInfo,
)

WS = "w0123456789abcde"
CALL_ID = "c0123456789abcdef0123456"
OWNER = "user:alice"


def _args(*argv: str) -> argparse.Namespace:
    parsed, rest = arguments.build_parser(["run"]).parse_known_args(["run", *argv])
    assert rest == []
    return parsed


def _models_call(args: argparse.Namespace) -> dict[str, Any]:
    request = run._run_request(args).model_copy(update={"call_id": CALL_ID})
    dumped: dict[str, Any] = build_call(request, OWNER).model_dump(mode="json")
    return dumped


PLAIN = [
    ["--workspace", WS, "true"],
    ["--host", "h1", "echo", "a  b", "'c'"],
    ["--workspace", WS, "--cwd", "/work/x", "make test"],
    ["--workspace", WS, "--timeout", "3.5", "sleep 1"],
    ["--workspace", WS, "--mode", "slow", "build"],
    ["--workspace", WS, "--mode", "slow", "--timeout", "7", "build"],
    ["--workspace", WS, "--background-on-timeout", "sleep 9"],
    ["--host", "h1", "--workspace", WS, "--isolation", "strict", "id"],
    ["--host", "h1", "--isolation", "none", "--cwd", "", "ls"],
    ["--workspace", WS, "caf\u00e9 \u2603 $HOME"],
]


@pytest.mark.parametrize("argv", PLAIN)
def test_the_plain_call_is_the_models_dump(argv: list[str]) -> None:
    args = _args(*argv)
    data = plain.call_data(args, call_id=CALL_ID, owner=OWNER)
    assert data is not None
    expected = _models_call(args)
    assert data == expected
    # Key for key in the same order, and what the worker reads back validates.
    assert json.dumps(data) == json.dumps(expected)
    assert models.Call.model_validate(data).model_dump(mode="json") == expected


NOT_PLAIN = [
    ["true"],  # no workspace nor host: placed on live hosts by the fleet client
    ["--workspace", WS, "--json", "true"],
    ["--workspace", WS, "--follow", "true"],
    ["--workspace", WS, "--session", "s1", "true"],
    ["--workspace", WS, "--mode", "background", "true"],
    ["--workspace", WS, "--tag", "a=b", "true"],
    ["--workspace", WS, "--network", "none", "true"],
    ["--image", "debian", "true"],
]


@pytest.mark.parametrize("argv", NOT_PLAIN)
def test_what_the_plain_path_does_not_do_goes_to_the_fleet_client(argv: list[str]) -> None:
    assert plain.call_data(_args(*argv), call_id=CALL_ID, owner=OWNER) is None


#: Arguments the models refuse: the plain path leaves each to the fleet client (which
#: says what is wrong), never sends it.
REFUSED = [
    ["--workspace", WS, "   "],
    ["--workspace", WS, "a\x00b"],
    ["--workspace", WS, "--timeout", "0", "true"],
    ["--workspace", WS, "--timeout", "-1", "true"],
    ["--workspace", WS, "--timeout", "90000", "true"],
    ["--workspace", "wnothex", "true"],
    ["--workspace", WS, "--cwd", "/a\x00b", "true"],
    ["--workspace", WS, "--cwd", "/" + "x" * 4096, "true"],
    ["--workspace", WS, "x" * (1024 * 1024 + 1)],
    ["--workspace", WS, "lone \udcff surrogate"],
]


@pytest.mark.parametrize("argv", REFUSED)
def test_what_the_models_refuse_is_left_to_the_fleet_client(argv: list[str]) -> None:
    args = _args(*argv)
    assert plain.call_data(args, call_id=CALL_ID, owner=OWNER) is None
    with pytest.raises((CallRejected, UnicodeEncodeError)):
        json.dumps(_models_call(args)).encode()


def test_an_owner_the_models_refuse_is_left_to_the_fleet_client() -> None:
    assert plain.call_data(_args("--workspace", WS, "true"), call_id=CALL_ID,
                           owner="no spaces") is None


def test_the_plain_path_holds_the_wires_limits_and_policy() -> None:
    assert plain.MAX_COMMAND_BYTES == models.MAX_COMMAND_BYTES
    assert plain.MAX_PATH_CHARS == models.MAX_PATH_CHARS
    assert plain.MAX_TIMEOUT_S == models.MAX_TIMEOUT_S
    assert plain.SLOW_TIMEOUT_S == models.SLOW_TIMEOUT_S
    for on_timeout in ("kill", "background"):
        assert plain.CLI_POLICY | {"on_timeout": on_timeout} == Policy(
            name="cli", on_timeout=on_timeout).model_dump(mode="json")


@settings(max_examples=200, deadline=None)
@given(command=st.text(min_size=1, max_size=40), cwd=st.none() | st.text(max_size=20),
       timeout=st.none() | st.floats(min_value=-5, max_value=100_000, allow_nan=False),
       slow=st.booleans(), keep=st.booleans())
def test_any_plain_call_is_the_models_dump_or_left_to_them(
    command: str, cwd: str | None, timeout: float | None, slow: bool, keep: bool,
) -> None:
    argv = ["--workspace", WS, "--mode", "slow" if slow else "default"]
    argv += [] if cwd is None else [f"--cwd={cwd}"]
    argv += [] if timeout is None else [f"--timeout={timeout!r}"]
    argv += ["--background-on-timeout"] if keep else []
    args = _args(*argv, "--", command)
    data = plain.call_data(args, call_id=CALL_ID, owner=OWNER)
    if data is not None:
        assert json.dumps(data) == json.dumps(_models_call(args))


# ------------------------------------------------------------------------ results


def _trunc(shown: int, total: int) -> TruncationInfo:
    return TruncationInfo(direction="tail", truncated=shown < total, limit="lines",
                          total_lines=total, total_bytes=total * 4, shown_lines=shown,
                          shown_bytes=shown * 4)


JOB = JobHandle(id="j3f2c9a1b7d4e5f6", host="a", pid=42, pgid=42, output_path="/o")
RESULTS = [
    CallResult(call_id="c1", host="a", exit_code=0),
    CallResult(call_id="c1", host="a", exit_code=3, stdout="out", stderr="err\n"),
    CallResult(call_id="c1", host="a", signal=9, stdout="x\ny\n"),
    CallResult(call_id="c1", host="a", exit_code=None, timed_out=True, signal=15,
               duration_s=2.25, stdout="partial"),
    CallResult(call_id="c1", host="a", exit_code=0, stdout="tail\n",
               stdout_truncation=_trunc(2, 9), stderr_truncation=_trunc(1, 1),
               spill=Spill(host="a", stdout_path="/s/out", stderr_path="/s/err"),
               error_digest=("error: a", "FAIL b")),
    CallResult(call_id="c1", host="a", stderr_truncation=_trunc(1, 5), exit_code=1),
    CallResult(call_id="c1", host="a", error=SystemError_(
        kind="bad_cwd", message="Working directory does not exist: /tmp/x")),
    CallResult(call_id="c1", host="a", error=SystemError_(kind="worker_lost", message="gone"),
               signal=9),
    CallResult(call_id="c1", host="a", cancelled=True, signal=15,
               error=SystemError_(kind="cancelled", message="cancelled")),
    CallResult(call_id="c1", host="a", backgrounded=True, timed_out=True, job=JOB,
               stdout="so far\n"),
]


@pytest.mark.parametrize("result", RESULTS)
@pytest.mark.parametrize("cwd", [None, "/tmp/x"])
def test_a_result_prints_the_same_from_its_json(
    result: CallResult, cwd: str | None, capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args("--workspace", WS, *(["--cwd", cwd] if cwd else []), "true")
    from_model = run.report_plainly(result, args)
    said = capsys.readouterr()
    # What the plain path prints: the worker's JSON, as it travels.
    data = plain.result_data(result.model_dump_json(), result.call_id)
    from_json = run.report_plainly(data, args)
    assert capsys.readouterr() == said
    assert from_json == from_model == exit_status.of_call(result)
    assert said.out or said.err or from_model == 0


def test_an_unreadable_answer_is_a_worker_error() -> None:
    for text in ("not json", "[]", '{"host": "a"}'):
        with pytest.raises(WorkerError, match="unreadable answer"):
            plain.result_data(text, "c1")


def test_a_random_uuid_reads_as_uuid4_does() -> None:
    seen = {random_uuid() for _ in range(200)}
    assert len(seen) == 200
    for text in seen:
        parsed = uuid.UUID(text)
        assert (str(parsed), parsed.version, parsed.variant) == (text, 4, uuid.RFC_4122)


def test_a_call_id_is_a_valid_one() -> None:
    ids = {new_call_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 24 and i[0] == "c" and names.valid_id(i) and int(i[1:], 16) >= 0
               for i in ids)


def test_aes_gcm_is_cryptographys_own() -> None:
    """Taken from its bindings (a faster load), it is the class of the public module."""
    assert auth.aesgcm_class() is AESGCM
    locked = auth.lock(["k1"], auth.REPLY, "c1", "text")
    assert auth.unlock(auth.keyring(["k1"]), auth.REPLY, "c1", locked) == "text"
