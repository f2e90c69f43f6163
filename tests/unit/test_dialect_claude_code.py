"""The claude-code dialect: Claude Code's tools of today (Bash, TaskOutput, TaskStop)
listed, so a model can call them; the older BashOutput and KillBash answered, the claude
dialect's texts kept."""

from __future__ import annotations

import json
import subprocess
import sys

from bashfleet.client.dialects import (
    ClaudeCodeDialect,
    SessionState,
    ToolText,
    get_dialect,
    schemas,
)
from bashfleet.client.dialects.testing import FakeRunner
from bashfleet.worker.wire.models import CallResult, CheckResult, JobHandle

CODE = ClaudeCodeDialect()
JOB = JobHandle(id="j5c2", host="h1", pid=777, pgid=777, output_path="/jobs/j5c2.log")


def test_the_tools_listed_are_claude_codes_of_today() -> None:
    tools = {tool["name"]: tool["input_schema"] for tool in schemas(CODE)}
    assert list(tools) == ["Bash", "TaskOutput", "TaskStop"]
    assert set(tools["Bash"]["properties"]) == {
        "command", "timeout", "description", "run_in_background"}
    assert "TaskOutput" in tools["Bash"]["properties"]["run_in_background"]["description"]
    assert tools["TaskOutput"]["required"] == ["task_id"]
    assert set(tools["TaskOutput"]["properties"]) == {"task_id", "block", "timeout"}
    assert tools["TaskStop"] == {
        "type": "object", "required": ["task_id"], "additionalProperties": False,
        "properties": {"task_id": {"type": "string",
                                   "description": "The ID of the background task to stop"}},
    }
    assert [spec.name for spec in CODE.aliases()] == ["BashOutput", "KillBash"]
    assert get_dialect("claude-code").policy() == CODE.policy().model_copy(
        update={"name": "claude-code"})


def test_seed_004s_claude_is_unchanged() -> None:
    assert [tool["name"] for tool in schemas(get_dialect("claude"))] == [
        "Bash", "BashOutput", "KillBash"]


def test_a_background_task_is_read_and_stopped_with_the_listed_tools() -> None:
    session = SessionState()
    started = CallResult(call_id="c1", host="h1", combined=True, backgrounded=True, job=JOB)
    answer = CODE.call("Bash", {"command": "npm run dev", "run_in_background": True},
                       FakeRunner(run=[started]), session)
    assert answer == ToolText("Command running in background with ID: j5c2")
    running = CheckResult(id="j5c2", host="h1", running=True, output="ready\n", offset=6)
    output = CODE.call("TaskOutput", {"task_id": "j5c2", "block": False},
                       FakeRunner(check=[running]), session)
    assert output.text == (
        "<retrieval_status>not_ready</retrieval_status>\n\n<task_id>j5c2</task_id>\n\n"
        "<task_type>local_bash</task_type>\n\n<status>running</status>\n\n"
        "<output>\nready\n</output>")
    stop = CODE.call("TaskStop", {"task_id": "j5c2"},
                     FakeRunner(check=[CheckResult(id="j5c2", host="h1", running=True)]),
                     session)
    assert stop == ToolText("Successfully stopped task: j5c2 (npm run dev)")
    # The older names still answer.
    again = CODE.call("KillBash", {"bash_id": "j5c2"}, FakeRunner(), session)
    assert again == ToolText(
        "Shell j5c2 is not running, so cannot be killed (status: killed)", True)


def test_task_stop_needs_its_task_id() -> None:
    answer = CODE.call("TaskStop", {}, FakeRunner(), SessionState())
    assert answer.is_error and "task_id" in answer.text


def test_the_cli_lists_its_schemas() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bashfleet.client.cli", "schema", "--dialect", "claude-code"],
        capture_output=True, text=True, check=True).stdout
    assert [tool["name"] for tool in json.loads(out)] == ["Bash", "TaskOutput", "TaskStop"]
