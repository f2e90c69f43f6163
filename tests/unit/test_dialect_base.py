"""The dialect machinery: registry, schemas, argument validation, sessions, the runner guard."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import bashfleet.client.dialects as dialects_pkg
from bashfleet.client.dialects import (
    DIALECTS,
    Dialect,
    MemorySessionStore,
    Runner,
    SessionState,
    ToolText,
    UnknownDialectError,
    get_dialect,
    schemas,
)
from bashfleet.client.dialects._text import (
    chomp,
    count_lines,
    cut_summary,
    seconds,
    shell_status,
    signal_label,
    system_failure,
)
from bashfleet.client.dialects.args import ArgError, command_problem, parse_args
from bashfleet.client.dialects.base import GuardedRunner, RunnerError
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.worker.wire.control import CheckRequest, KillRequest
from bashfleet.worker.wire.models import (
    MAX_COMMAND_BYTES,
    CallResult,
    CheckResult,
    JobHandle,
    ProcessInfo,
    RunRequest,
    Spill,
    SystemError_,
    TruncationInfo,
)

NAMES = ["pipe", "modes", "pi", "claude", "claude-code", "native", "codex"]


def command_args(name: str, command: str) -> dict[str, object]:
    """The first tool's arguments that run `command` (codex calls it `cmd`)."""
    return {"cmd" if name == "codex" else "command": command}


# --------------------------------------------------------------------------- registry


def test_registry_has_the_six_dialects() -> None:
    assert sorted(DIALECTS) == sorted(NAMES)
    for name in NAMES:
        dialect = get_dialect(name)
        assert isinstance(dialect, Dialect)
        assert dialect.name == name
        assert dialect.policy().name == name


def test_unknown_dialect_lists_the_known_ones() -> None:
    with pytest.raises(UnknownDialectError) as caught:
        get_dialect("bogus")
    assert str(caught.value) == (
        "unknown dialect 'bogus'; known dialects: "
        "claude, claude-code, codex, modes, native, pi, pipe"
    )
    assert isinstance(caught.value, ValueError)


def test_public_names_are_declared_once() -> None:
    for name in dialects_pkg.__all__:
        assert hasattr(dialects_pkg, name), name
    assert len(set(dialects_pkg.__all__)) == len(dialects_pkg.__all__)


# ---------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("name", NAMES)
def test_every_input_schema_is_valid_json_schema(name: str) -> None:
    for tool in schemas(get_dialect(name), cwd="/work"):
        jsonschema.Draft202012Validator.check_schema(tool["input_schema"])
        assert tool["input_schema"]["type"] == "object"
        assert tool["description"]
        json.dumps(tool)  # serializable as is


@pytest.mark.parametrize("name", NAMES)
def test_tool_names_are_unique_and_match_handlers(name: str) -> None:
    dialect = get_dialect(name)
    names = [spec.name for spec in [*dialect.tools(), *dialect.aliases()]]
    assert len(names) == len(set(names))
    assert set(names) == set(dialect.handlers())


def test_schema_styles() -> None:
    """Each style is the shape its API takes in `tools` (`openai` once lacked Chat
    Completions' `{"type": "function", "function": ...}` wrapper)."""
    dialect = get_dialect("pipe")
    anthropic = schemas(dialect)[0]
    openai = schemas(dialect, style="openai")[0]
    responses = schemas(dialect, style="openai-responses")[0]
    mcp = schemas(dialect, style="mcp")[0]
    function = schemas(dialect, style="function")[0]
    assert set(anthropic) == {"name", "description", "input_schema"}
    assert set(openai) == {"type", "function"} and openai["type"] == "function"
    assert openai["function"] == function
    assert set(function) == {"name", "description", "parameters"}
    # The Responses API: flat, and not strict (it defaults to strict, which refuses
    # optional properties).
    assert responses == {"type": "function", **function, "strict": False}
    assert set(mcp) == {"name", "description", "inputSchema"}
    assert anthropic["input_schema"] == function["parameters"] == mcp["inputSchema"]
    assert anthropic["name"] == function["name"] == mcp["name"] == "bash"


def test_an_unknown_schema_style_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="openai-responses"):
        schemas(get_dialect("pipe"), style="openapi")  # type: ignore[arg-type]


def test_schemas_are_copies() -> None:
    dialect = get_dialect("claude")
    schemas(dialect)[0]["input_schema"]["properties"].clear()
    assert schemas(dialect)[0]["input_schema"]["properties"]


# ------------------------------------------------------------------ argument checking

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "s": {"type": "string"},
        "i": {"type": "integer"},
        "n": {"type": "number"},
        "b": {"type": "boolean"},
        "e": {"type": "string", "enum": ["x", "y"]},
    },
    "required": ["s"],
}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "the arguments of t must be a JSON object, not an array"),
        ("ls", "the arguments of t must be a JSON object, not a string"),
        ({}, "missing required parameter 's'"),
        ({"s": None}, "missing required parameter 's'"),
        ({"s": "a", "zz": 1}, "unknown parameter 'zz' (t takes: s, i, n, b, e)"),
        ({"s": 1}, "parameter 's' must be a string, not a number (1)"),
        ({"s": "a", "i": "5"}, "parameter 'i' must be an integer, not a string ('5')"),
        ({"s": "a", "i": 1.5}, "parameter 'i' must be an integer, not a number (1.5)"),
        ({"s": "a", "i": True}, "parameter 'i' must be an integer, not a boolean (True)"),
        ({"s": "a", "n": math.nan}, "parameter 'n' must be a number, not a number (nan)"),
        ({"s": "a", "n": math.inf}, "parameter 'n' must be a number, not a number (inf)"),
        ({"s": "a", "b": "true"}, "parameter 'b' must be true or false, not a string ('true')"),
        ({"s": "a", "e": "z"}, "parameter 'e' must be one of 'x', 'y', not 'z'"),
        ({"s": ["a"]}, "parameter 's' must be a string, not an array (['a'])"),
        (
            {"s": "a" * 100, "i": "b" * 100},
            "parameter 'i' must be an integer, not a string ('" + "b" * 36 + "...)",
        ),
    ],
)
def test_parse_args_refusals(raw: object, message: str) -> None:
    with pytest.raises(ArgError) as caught:
        parse_args("t", SCHEMA, raw)
    assert str(caught.value) == message


def test_parse_args_accepts_and_types() -> None:
    args = parse_args("t", SCHEMA, {"s": "a", "i": 3.0, "n": 2, "b": False, "e": "y"})
    assert args.text("s") == "a"
    assert args.integer("i") == 3 and isinstance(args.integer("i"), int)
    assert args.number("n") == 2.0
    assert args.flag("b") is False
    assert args.given("b") and not args.given("nothing")
    assert args.integer("s") is None and args.text("i") is None and args.number("b") is None


def test_null_counts_as_absent() -> None:
    args = parse_args("t", SCHEMA, {"s": "a", "i": None, "b": None})
    assert not args.given("i") and not args.given("b")


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("ls", None),
        ("  \n\t", "command is empty"),
        ("echo \x00", "command contains a NUL byte, which bash cannot receive"),
        (
            "x" * (MAX_COMMAND_BYTES + 1),
            f"command is {MAX_COMMAND_BYTES + 1} bytes; the limit is {MAX_COMMAND_BYTES}: "
            "write long scripts to a file and run the file",
        ),
    ],
)
def test_command_problem(command: str, problem: str | None) -> None:
    assert command_problem(command) == problem


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=6,
)


@given(
    name=st.sampled_from(NAMES),
    raw=st.dictionaries(
        st.sampled_from(
            [
                "command",
                "timeout",
                "mode",
                "cwd",
                "head",
                "tail",
                "check_pid",
                "kill_pid",
                "bash_id",
                "filter",
                "id",
                "grep",
                "offset",
                "host",
                "session",
                "run_in_background",
                "description",
            ]
        ),
        json_values,
        max_size=5,
    ),
)
@settings(max_examples=300, deadline=None)  # a shared 2-core box: time is not the property
def test_parser_agrees_with_jsonschema(name: str, raw: dict[str, object]) -> None:
    for spec in get_dialect(name).tools():
        check_agreement(spec.input_schema, spec.name, raw)


def _fitting(spec: dict[str, Any]) -> st.SearchStrategy[object]:
    """Values one property's schema accepts."""
    if "enum" in spec:
        return st.sampled_from(spec["enum"])
    low = spec.get("minimum")
    match spec.get("type"):
        case "string":
            return st.text(max_size=8)
        case "boolean":
            return st.booleans()
        case "integer":
            return st.integers(min_value=low, max_value=10**6)
        case "number":
            return st.integers(min_value=low, max_value=10**6) | st.floats(
                min_value=low, max_value=1e6, allow_nan=False, allow_infinity=False)
    return json_values


@given(name=st.sampled_from(NAMES), data=st.data())
@settings(max_examples=300, deadline=None)
def test_parser_accepts_what_the_schema_accepts(name: str, data: st.DataObject) -> None:
    """Arguments made to fit each tool's schema (with nulls for some of them): both accept."""
    for spec in get_dialect(name).tools():
        schema = spec.input_schema
        required = set(schema.get("required", ()))
        raw = {key: data.draw(_fitting(prop) if key in required else
                              st.none() | _fitting(prop), label=f"{spec.name}.{key}")
               for key, prop in schema["properties"].items()
               if key in required or data.draw(st.booleans())}
        assert check_agreement(schema, spec.name, raw) == "accepted by both"


def check_agreement(schema: dict[str, Any], tool: str, raw: dict[str, object], *,
                    theirs: dict[str, Any] | None = None) -> str:
    """Our checker against jsonschema on one input (nulls dropped: we treat them as
    absent). What ours accepts, jsonschema accepts. What ours refuses, jsonschema refuses
    too, and ours names a parameter jsonschema blames; or ours alone refuses it, for one of
    its two deliberate rules: a parameter the schema does not name, a number that is not
    finite. Returns which of the three it was. (`theirs`: the schema jsonschema reads,
    when it is not `schema`: the check's own test.)"""
    present = {key: value for key, value in raw.items() if value is not None}
    validator = jsonschema.Draft202012Validator(schema if theirs is None else theirs)
    try:
        parse_args(tool, schema, raw)
    except ArgError as refused:
        said = str(refused)
        named = re.search(r"parameter '([^']*)'", said)
        assert named is not None, said
        unknown = {key for key in raw if key not in schema["properties"]}
        infinite = {key for key, value in present.items()
                    if isinstance(value, float) and not math.isfinite(value)}
        errors = list(validator.iter_errors(present))
        if not errors:  # ours alone: one of its own rules
            assert named.group(1) in unknown | infinite, (said, raw)
            return "refused by ours alone"
        blamed = {str(error.path[0]) for error in errors if error.path}
        blamed |= {key for key in schema.get("required", ()) if key not in present}
        assert named.group(1) in blamed | unknown | infinite, (said, [e.message for e in errors])
        return "refused by both"
    validator.validate(present)
    return "accepted by both"


CHECKED_PROPERTIES: dict[str, Any] = {
    "command": {"type": "string"},
    "timeout": {"type": "number", "minimum": 0},
    "lines": {"type": "integer"},
    "mode": {"type": "string", "enum": ["a", "b"]},
}
CHECKED: dict[str, Any] = {
    "type": "object", "properties": CHECKED_PROPERTIES, "required": ["command"]
}


@pytest.mark.parametrize(("raw", "expected"), [
    ({"command": "ls"}, "accepted by both"),
    ({"command": "ls", "timeout": None, "lines": 3.0, "mode": "a"}, "accepted by both"),
    ({}, "refused by both"),  # missing required
    ({"command": 1}, "refused by both"),
    ({"command": "ls", "timeout": -1}, "refused by both"),
    ({"command": "ls", "lines": 1.5}, "refused by both"),
    ({"command": "ls", "lines": True}, "refused by both"),
    ({"command": "ls", "mode": "c"}, "refused by both"),
    ({"command": "ls", "timout": 5}, "refused by ours alone"),  # misspelt: never ignored
    ({"command": "ls", "timeout": math.inf}, "refused by ours alone"),
])
def test_agreement_cases(raw: dict[str, object], expected: str) -> None:
    assert check_agreement(CHECKED, "t", raw) == expected


def test_a_disagreement_is_caught() -> None:
    """The check fails where ours accepts what jsonschema refuses, and where ours refuses
    for a reason jsonschema does not share."""
    loose = {**CHECKED, "properties": {**CHECKED_PROPERTIES, "lines": {"type": "number"}}}
    raw: dict[str, object] = {"command": "ls", "lines": 1.5}
    with pytest.raises(jsonschema.ValidationError):
        check_agreement(loose, "t", raw, theirs=CHECKED)
    with pytest.raises(AssertionError):
        check_agreement(CHECKED, "t", raw, theirs=loose)


# ---------------------------------------------------------------------------- session


def test_memory_store_returns_copies() -> None:
    store = MemorySessionStore()
    fresh = store.load("s1")
    assert fresh == SessionState()
    fresh.env["A"] = "1"
    assert store.load("s1").env == {}  # not saved yet
    store.save("s1", fresh)
    fresh.env["B"] = "2"
    assert store.load("s1").env == {"A": "1"}
    assert store.load("other") == SessionState()


def test_session_state_round_trips_json() -> None:
    state = SessionState(cwd="/w", env={"A": "1"}, host="h1")
    state.remember(
        JobHandle(id="j1", host="h1", pid=42, pgid=42, output_path="/o"), "sleep 1", "/e"
    )
    state.offsets["j1"] = 10
    again = SessionState.model_validate_json(state.model_dump_json())
    assert again == state
    assert again.pids == {42: "j1"}
    assert again.jobs["j1"].stderr_path == "/e"


def test_a_reused_pid_maps_to_the_newer_job() -> None:
    state = SessionState()
    state.remember(JobHandle(id="j1", host="h1", pid=42, pgid=42, output_path="/1"), "a")
    state.remember(JobHandle(id="j2", host="h2", pid=42, pgid=42, output_path="/2"), "b")
    assert state.pids[42] == "j2"
    assert set(state.jobs) == {"j1", "j2"}


# ----------------------------------------------------------------------------- runner


def test_fake_runner_is_a_runner() -> None:
    assert isinstance(FakeRunner(), Runner)


def test_guarded_runner_converts_exceptions() -> None:
    guarded = GuardedRunner(FakeRunner(error=ConnectionError("redis is down")))
    actions: list[Callable[[], object]] = [
        lambda: guarded.execute(RunRequest(command="ls")),
        lambda: guarded.check_job(CheckRequest(id="j")),
        lambda: guarded.kill_job(KillRequest(id="j")),
    ]
    for action in actions:
        with pytest.raises(RunnerError) as caught:
            action()
        assert str(caught.value) == "ConnectionError: redis is down"
    with pytest.raises(RunnerError, match=r"^TimeoutError$"):
        GuardedRunner(FakeRunner(error=TimeoutError())).execute(RunRequest(command="ls"))


@pytest.mark.parametrize("name", NAMES)
def test_runner_failure_is_a_system_error_of_the_dialect(name: str) -> None:
    dialect = get_dialect(name)
    tool = dialect.tools()[0].name
    answer = dialect.call(
        tool, command_args(name, "ls"), FakeRunner(error=OSError("no route")), SessionState()
    )
    assert isinstance(answer, ToolText)
    assert answer.is_error
    assert "OSError: no route" in answer.text


@pytest.mark.parametrize("name", NAMES)
def test_a_rendering_bug_is_not_swallowed(name: str) -> None:
    """Only the runner's exceptions become system errors: our own bugs must surface."""

    class Broken(FakeRunner):
        def execute(self, request: RunRequest) -> CallResult:
            return "not a result"  # type: ignore[return-value]

    dialect = get_dialect(name)
    with pytest.raises(AttributeError):
        dialect.call(dialect.tools()[0].name, command_args(name, "ls"), Broken(), SessionState())


# ----------------------------------------------------------------------- text helpers


def test_text_helpers() -> None:
    assert seconds(120.0) == "120s"
    assert seconds(1.5) == "1.5s"
    assert signal_label(9) == "SIGKILL"
    assert signal_label(99) == "signal 99"
    assert shell_status(3, None) == 3
    assert shell_status(None, 9) == 137
    assert shell_status(None, None) is None
    assert chomp("a\n") == "a" and chomp("a\n\n") == "a\n" and chomp("a") == "a"
    assert count_lines("") == 0 and count_lines("a") == 1 and count_lines("a\nb\n") == 2


def test_cut_summary() -> None:
    tail = TruncationInfo(
        direction="tail",
        truncated=True,
        limit="lines",
        total_lines=8500,
        total_bytes=400000,
        shown_lines=2000,
        shown_bytes=51200,
        shown_ranges=((6501, 8500),),
    )
    assert cut_summary(tail) == (
        "showing the last 2000 of 8500 lines (51200 of 400000 bytes, lines limit)"
    )
    middle = TruncationInfo(
        direction="middle",
        truncated=True,
        limit="bytes",
        total_lines=9100,
        total_bytes=900000,
        shown_lines=150,
        shown_bytes=8192,
        partial_line=True,
        shown_ranges=((1, 80), (9031, 9100)),
    )
    assert cut_summary(middle) == (
        "showing lines 1-80 and 9031-9100 of 9100 (8192 of 900000 bytes, bytes limit); "
        "a line at the cut is shown in part"
    )


def test_system_failure_only_when_nothing_ran() -> None:
    error = SystemError_(kind="bad_cwd", message="no")
    assert system_failure(CallResult(call_id="c", host="h", error=error)) == error
    assert system_failure(CallResult(call_id="c", host="h", error=error, signal=9)) is None
    assert system_failure(CallResult(call_id="c", host="h", error=error, timed_out=True)) is None
    assert system_failure(CallResult(call_id="c", host="h", exit_code=1)) is None


# ------------------------------------------------- any wire result renders, any dialect

small = st.integers(min_value=0, max_value=10_000)
truncations = st.none() | st.builds(
    TruncationInfo,
    direction=st.sampled_from(["tail", "head", "middle"]),
    truncated=st.booleans(),
    limit=st.sampled_from([None, "lines", "bytes", "chars"]),
    total_lines=small,
    total_bytes=small,
    shown_lines=small,
    shown_bytes=small,
    partial_line=st.booleans(),
    shown_ranges=st.sampled_from([(), ((1, 5),), ((1, 2), (9, 10))]),
)
texts = st.text(max_size=20)
spills = st.none() | st.builds(
    Spill,
    host=texts,
    stdout_path=st.none() | texts,
    stderr_path=st.none() | texts,
    stdout_bytes=small,
    stderr_bytes=small,
    error=st.none() | texts,
)
jobs = st.none() | st.builds(
    JobHandle, id=texts, host=texts, pid=small, pgid=small, output_path=texts
)
errors = st.none() | st.builds(
    SystemError_,
    kind=st.sampled_from(["bad_cwd", "blocked", "internal", "worker_lost"]),
    message=texts,
)
call_results = st.builds(
    CallResult,
    call_id=texts,
    host=texts,
    exit_code=st.none() | st.integers(min_value=0, max_value=255),
    signal=st.none() | st.integers(min_value=1, max_value=64),
    timed_out=st.booleans(),
    backgrounded=st.booleans(),
    error=errors,
    combined=st.booleans(),
    stdout=texts,
    stderr=texts,
    stdout_truncation=truncations,
    stderr_truncation=truncations,
    spill=spills,
    job=jobs,
    error_digest=st.lists(texts, max_size=2).map(tuple),
    processes=st.lists(
        st.builds(ProcessInfo, pid=small, state=texts, cpu_s=st.floats(0, 100), command=texts),
        max_size=2,
    ).map(tuple),
    duration_s=st.floats(0, 1000),
    cwd=st.none() | texts,
)
check_results = st.builds(
    CheckResult,
    id=st.just("j1"),
    host=texts,
    running=st.booleans(),
    exit_code=st.none() | st.integers(min_value=0, max_value=255),
    signal=st.none() | st.integers(min_value=1, max_value=64),
    output=texts,
    offset=small,
    output_truncation=truncations,
    output_path=texts,
    stderr_output=texts,
    stderr_offset=small,
    note=st.none() | texts,
)
#: (dialect, tool, arguments) covering every handler; job j1 / pid 42 are in the session.
CALLS = [
    ("pipe", "bash", {"command": "x"}),
    ("pipe", "bash", {"check_pid": 42}),
    ("pipe", "bash", {"kill_pid": 42}),
    ("modes", "bash", {"command": "x"}),
    ("modes", "bash", {"command": "x", "mode": "background"}),
    ("modes", "bash", {"command": "x", "mode": "slow"}),
    ("pi", "bash", {"command": "x"}),
    ("claude", "Bash", {"command": "x"}),
    ("claude", "Bash", {"command": "x", "run_in_background": True}),
    ("claude", "BashOutput", {"bash_id": "j1"}),
    ("claude", "KillBash", {"bash_id": "j1"}),
    ("native", "bash", {"command": "x"}),
    ("native", "bash_check", {"id": "j1"}),
    ("native", "bash_kill", {"id": "j1"}),
]


@given(case=st.sampled_from(CALLS), run=call_results, check=check_results, kill=check_results)
@settings(max_examples=500, deadline=None)  # a shared 2-core box: time is not the property
def test_any_wire_result_renders(
    case: tuple[str, str, dict[str, object]],
    run: CallResult,
    check: CheckResult,
    kill: CheckResult,
) -> None:
    name, tool, args = case
    session = SessionState()
    session.remember(JobHandle(id="j1", host="h", pid=42, pgid=42, output_path="/o"), "cmd")
    runner = FakeRunner(run=[run], check=[check], kill=[kill])
    answer = get_dialect(name).call(tool, args, runner, session)
    assert isinstance(answer, ToolText) and isinstance(answer.text, str)
    SessionState.model_validate_json(session.model_dump_json())  # still storable
