"""Retention: planning (pure: ages, the size cap's order, what is never removed), and the
executor on a temporary directory (what changed since the plan is left alone)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from bashfleet.worker.retention import (
    Inventory,
    JobRef,
    Kind,
    Plan,
    RetentionPolicy,
    StateFile,
    classify,
    execute,
    gc_command,
    plan,
    report,
    scan,
    state_dirs,
)
from bashfleet.worker.settings import Settings

NOW = 1_700_000_000.0
DAY = 86400.0
HOUR = 3600.0
SPILL = "/state/spill"
JOBS = "/state/jobs"
#: Seven days, 10 GiB, one hour: the defaults.
LIMITS = RetentionPolicy(max_age_s=7 * DAY, max_bytes=10 * 1024**3, min_age_s=HOUR)


def spill(call_id: str, suffix: str, *, age: float, size: int = 100) -> StateFile:
    return StateFile(f"{SPILL}/{call_id}.{suffix}", "spill", call_id, size, NOW - age)


def job_file(job_id: str, suffix: str, *, age: float, size: int = 100) -> StateFile:
    return StateFile(f"{JOBS}/{job_id}.{suffix}", "job", job_id, size, NOW - age)


def job_files(job_id: str, *, age: float, size: int = 100) -> list[StateFile]:
    return [job_file(job_id, s, age=age, size=size) for s in ("log", "status.json", "json")]


def ref(job_id: str, *, live: bool, call_id: str | None = None, output: str | None = None,
        stderr: str | None = None) -> JobRef:
    paths = {output or f"{JOBS}/{job_id}.log", f"{JOBS}/{job_id}.status.json",
             f"{JOBS}/{job_id}.json"}
    if stderr:
        paths.add(stderr)
    return JobRef(job_id, call_id, frozenset(paths), live)


def removed(result: Plan) -> dict[str, str]:
    return {Path(r.path).name: r.reason for r in result.removals}


def held(result: Plan) -> dict[str, str]:
    return {h.group: h.reason for h in result.held}


# ------------------------------------------------------------------------------ names


@pytest.mark.parametrize(
    ("name", "kind", "key"),
    [
        ("c1.out", "spill", "c1"),
        ("c1.err", "spill", "c1"),
        ("call.with.dots.log", "spill", "call.with.dots"),
        ("c1.state", "spill", "c1"),
        ("c1.txt", "spill", None),
        ("README", "spill", None),
        ("jabc.log", "job", "jabc"),
        ("jabc.json", "job", "jabc"),
        ("jabc.status.json", "job", "jabc"),
        ("jabc.spec.json", "job", "jabc"),
        ("jabc.read", "job", "jabc"),
        ("jabc.read.lock", "job", "jabc"),
        ("jabc.sock", "job", None),
        ("jabc.json.tmp", "job", "jabc"),
        (f"jabc.status.json.{'0' * 32}.tmp", "job", "jabc"),
        ("jabc.status.json.nothex.tmp", "job", None),
        ("notes.txt", "job", None),
    ],
)
def test_only_names_we_write_are_ours(name: str, kind: Kind, key: str | None) -> None:
    assert classify(Path(name), kind) == key


# ------------------------------------------------------------------------------- ages


def test_files_older_than_the_age_limit_go_younger_ones_stay() -> None:
    inventory = Inventory(
        NOW,
        (
            spill("old", "out", age=8 * DAY), spill("old", "err", age=8 * DAY),
            spill("recent", "log", age=2 * DAY),
            *job_files("jold", age=9 * DAY), *job_files("jnew", age=3 * DAY),
        ),
        jobs=(ref("jold", live=False), ref("jnew", live=False)),
    )
    result = plan(inventory, LIMITS)
    assert removed(result) == {
        "old.out": "max_age", "old.err": "max_age",
        "jold.log": "max_age", "jold.status.json": "max_age", "jold.json": "max_age",
    }
    assert result.held == ()
    assert result.total_bytes == 900
    assert result.remaining_bytes == 400


def test_a_group_is_as_old_as_its_newest_file() -> None:
    # A job's record is old but its log was written yesterday: the job stays whole.
    files = (job_file("j1", "json", age=30 * DAY), job_file("j1", "log", age=DAY))
    result = plan(Inventory(NOW, files, jobs=(ref("j1", live=False),)), LIMITS)
    assert result.removals == ()


def test_a_jobs_record_is_removed_last() -> None:
    result = plan(Inventory(NOW, tuple(job_files("j1", age=8 * DAY))), LIMITS)
    assert [Path(r.path).name for r in result.removals][-1] == "j1.json"


def test_ages_and_reasons_are_reported_per_file() -> None:
    result = plan(Inventory(NOW, (spill("c", "out", age=8 * DAY, size=5),)), LIMITS)
    (only,) = result.removals
    assert (only.size, only.age_s, only.reason, only.group) == (5, 8 * DAY, "max_age", "call c")
    data = report(Path("/state"), result, None)
    assert data["dry_run"] is True
    assert data["remove"] == [
        {"path": f"{SPILL}/c.out", "size": 5, "age_s": 8 * DAY, "reason": "max_age",
         "group": "call c"},
    ]


# --------------------------------------------------------------------------- size cap


def test_the_size_cap_removes_the_oldest_first_until_under_it() -> None:
    # c5 is the oldest, c0 the youngest; none is past the age limit.
    files = tuple(spill(f"c{i}", "out", age=(i + 2) * HOUR, size=1000) for i in range(6))
    limits = RetentionPolicy(max_age_s=7 * DAY, max_bytes=2500, min_age_s=HOUR)
    result = plan(Inventory(NOW, files), limits)
    assert [r.group for r in result.removals] == ["call c5", "call c4", "call c3", "call c2"]
    assert {r.reason for r in result.removals} == {"max_bytes"}
    assert result.remaining_bytes == 2000


def test_the_size_cap_counts_what_the_age_limit_removed_first() -> None:
    files = (
        spill("ancient", "out", age=10 * DAY, size=5000),
        spill("a", "out", age=3 * DAY, size=1000),
        spill("b", "out", age=2 * DAY, size=1000),
    )
    result = plan(Inventory(NOW, files), RetentionPolicy(max_age_s=7 * DAY, max_bytes=1500,
                                                min_age_s=HOUR))
    assert removed(result) == {"ancient.out": "max_age", "a.out": "max_bytes"}
    assert result.remaining_bytes == 1000


def test_the_size_cap_stops_as_soon_as_it_is_met() -> None:
    files = tuple(spill(f"c{i}", "out", age=(i + 2) * HOUR, size=1000) for i in range(4))
    result = plan(Inventory(NOW, files), RetentionPolicy(max_age_s=7 * DAY, max_bytes=2000,
                                                min_age_s=HOUR))
    assert [r.group for r in result.removals] == ["call c3", "call c2"]
    assert result.remaining_bytes == 2000


def test_held_groups_count_toward_the_cap_but_are_never_removed() -> None:
    files = (
        *job_files("jlive", age=20 * DAY, size=10_000),
        spill("c1", "out", age=2 * DAY, size=100),
    )
    limits = RetentionPolicy(max_age_s=7 * DAY, max_bytes=1000, min_age_s=HOUR)
    result = plan(Inventory(NOW, files, jobs=(ref("jlive", live=True),)), limits)
    assert removed(result) == {"c1.out": "max_bytes"}
    assert held(result) == {"job jlive": "live_job"}
    assert report(Path("/state"), result, None)["over_cap"] is True


def test_the_same_state_gives_the_same_plan() -> None:
    files = tuple(spill(f"c{i}", "out", age=2 * DAY, size=10) for i in range(5))
    limits = RetentionPolicy(max_age_s=7 * DAY, max_bytes=25, min_age_s=HOUR)
    first = plan(Inventory(NOW, files), limits)
    again = plan(Inventory(NOW, tuple(reversed(files))), limits)
    assert first == again
    assert [r.group for r in first.removals] == ["call c0", "call c1", "call c2"]


# ------------------------------------------------------------------- never removed


def test_a_live_jobs_files_are_kept_however_old() -> None:
    inventory = Inventory(NOW, tuple(job_files("j1", age=30 * DAY)),
                          jobs=(ref("j1", live=True),))
    result = plan(inventory, RetentionPolicy(max_age_s=DAY, max_bytes=0, min_age_s=0))
    assert result.removals == ()
    assert held(result) == {"job j1": "live_job"}


def test_an_auto_backgrounded_live_jobs_spill_files_are_kept() -> None:
    # A timed-out foreground call that became job j1: its output stays in the spill dir.
    files = (
        spill("call7", "out", age=30 * DAY), spill("call7", "err", age=30 * DAY),
        job_file("j1", "json", age=30 * DAY),
    )
    job = ref("j1", live=True, call_id="call7", output=f"{SPILL}/call7.out",
              stderr=f"{SPILL}/call7.err")
    result = plan(Inventory(NOW, files, jobs=(job,)), RetentionPolicy(DAY, 0, 0))
    assert result.removals == ()
    assert held(result) == {"job j1": "live_job"}


def test_spill_files_named_by_a_live_job_are_kept_even_under_another_name() -> None:
    # Matched by path, not only by call id.
    files = (spill("other", "log", age=30 * DAY), job_file("j1", "json", age=30 * DAY))
    job = ref("j1", live=True, call_id=None, output=f"{SPILL}/other.log")
    result = plan(Inventory(NOW, files, jobs=(job,)), RetentionPolicy(DAY, 0, 0))
    assert result.removals == ()


def test_an_ended_auto_backgrounded_job_goes_with_its_spill_files() -> None:
    files = (
        spill("call7", "out", age=9 * DAY), spill("call7", "err", age=9 * DAY),
        *job_files("j1", age=8 * DAY),
    )
    job = ref("j1", live=False, call_id="call7", output=f"{SPILL}/call7.out",
              stderr=f"{SPILL}/call7.err")
    result = plan(Inventory(NOW, files, jobs=(job,)), LIMITS)
    assert set(removed(result)) == {
        "call7.out", "call7.err", "j1.log", "j1.status.json", "j1.json",
    }
    assert {r.group for r in result.removals} == {"job j1"}


def test_an_ended_jobs_spill_files_are_as_young_as_its_newest_file() -> None:
    files = (spill("call7", "out", age=30 * DAY), job_file("j1", "json", age=2 * DAY))
    job = ref("j1", live=False, call_id="call7", output=f"{SPILL}/call7.out")
    result = plan(Inventory(NOW, files, jobs=(job,)), LIMITS)
    assert result.removals == ()


def test_files_younger_than_the_minimum_age_are_kept_even_over_the_cap() -> None:
    files = (
        spill("fresh", "out", age=10 * 60, size=10**9),
        spill("old", "out", age=2 * HOUR, size=10),
    )
    result = plan(Inventory(NOW, files), RetentionPolicy(max_age_s=0, max_bytes=0, min_age_s=HOUR))
    assert removed(result) == {"old.out": "max_age"}
    assert held(result) == {"call fresh": "min_age"}


def test_one_young_file_keeps_its_whole_group() -> None:
    files = (spill("c1", "out", age=30 * DAY), spill("c1", "err", age=60))
    result = plan(Inventory(NOW, files), LIMITS)
    assert result.removals == ()
    assert held(result) == {"call c1": "min_age"}


def test_a_file_from_the_future_counts_as_young() -> None:
    result = plan(Inventory(NOW, (spill("c1", "out", age=-DAY),)), RetentionPolicy(0, 0, HOUR))
    assert held(result) == {"call c1": "min_age"}


def test_a_running_calls_spill_files_are_kept_however_old() -> None:
    # A quiet foreground command (`sleep 3600`) does not touch its spill files.
    files = (spill("busy", "out", age=30 * DAY), spill("busy", "err", age=30 * DAY),
             spill("done", "out", age=30 * DAY))
    inventory = Inventory(NOW, files, running_calls=frozenset({"busy"}))
    result = plan(inventory, RetentionPolicy(max_age_s=DAY, max_bytes=0, min_age_s=0))
    assert removed(result) == {"done.out": "max_age"}
    assert held(result) == {"call busy": "running_call"}


def test_a_minimum_age_of_zero_and_no_limits_remove_everything_unused() -> None:
    files = (spill("a", "out", age=1), *job_files("j1", age=1))
    result = plan(Inventory(NOW, files, jobs=(ref("j1", live=False),)), RetentionPolicy(0, 0, 0))
    assert len(result.removals) == 4
    assert result.remaining_bytes == 0


def test_job_files_without_a_record_are_grouped_by_job_id() -> None:
    files = (job_file("jx", "log", age=8 * DAY), job_file("jx", "spec.json", age=8 * DAY))
    result = plan(Inventory(NOW, files), LIMITS)
    assert {r.group for r in result.removals} == {"job jx"}


# --------------------------------------------------------------------------- executor


def _old_files(tmp_path: Path, *names: str) -> Settings:
    settings = Settings(state_dir=tmp_path, host="unit")
    settings.spill_dir.mkdir(parents=True)
    stamp = time.time() - 30 * DAY
    for name in names:
        path = settings.spill_dir / name
        path.write_text("output\n")
        os.utime(path, (stamp, stamp))
    return settings


def test_execute_removes_what_the_plan_says(tmp_path: Path) -> None:
    settings = _old_files(tmp_path, "a.out", "a.err", "b.log", "notes.txt")
    result = plan(scan(settings), LIMITS)
    outcome = execute(result)
    assert sorted(Path(r.path).name for r in outcome.removed) == ["a.err", "a.out", "b.log"]
    assert not outcome.skipped and not outcome.errors
    assert [p.name for p in settings.spill_dir.iterdir()] == ["notes.txt"], "not ours"


def test_execute_leaves_a_group_written_since_the_plan(tmp_path: Path) -> None:
    settings = _old_files(tmp_path, "a.out", "a.err", "b.log")
    result = plan(scan(settings), LIMITS)
    with (settings.spill_dir / "a.err").open("a") as handle:
        handle.write("late\n")
    outcome = execute(result)
    assert [Path(r.path).name for r in outcome.removed] == ["b.log"]
    assert sorted((Path(r.path).name, why) for r, why in outcome.skipped) == [
        ("a.err", "changed since the plan was made"),
        ("a.out", "changed since the plan was made"),
    ]
    assert (settings.spill_dir / "a.out").exists()


def test_execute_counts_files_already_gone(tmp_path: Path) -> None:
    settings = _old_files(tmp_path, "a.out")
    result = plan(scan(settings), LIMITS)
    (settings.spill_dir / "a.out").unlink()
    outcome = execute(result)
    assert outcome.removed == [] and [why for _, why in outcome.skipped] == ["already gone"]


def test_scan_of_a_missing_state_dir_is_empty(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "none", host="unit")
    assert plan(scan(settings), LIMITS).removals == ()


# ---------------------------------------------------------- a local fleet's host directories


def _spilled(state_dir: Path, call_id: str, size: int, age_s: float) -> Path:
    spill_dir = state_dir / "spill"
    spill_dir.mkdir(parents=True, exist_ok=True)
    path = spill_dir / f"{call_id}.out"
    path.write_bytes(b"x" * size)
    stamp = time.time() - age_s
    os.utime(path, (stamp, stamp))
    return path


def test_gc_counts_and_collects_the_local_fleets_host_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gc --dry-run` said "0 B known" while MBs of spill files sat under the local
    fleet's host directories (`<state>/hosts/<host>`): each is collected as its host's
    own `gc` would."""
    settings = Settings(state_dir=tmp_path, host="unit")
    old_a = _spilled(tmp_path / "hosts" / "a", "c-old-a", 3 * 1024 * 1024, 9 * DAY)
    new_b = _spilled(tmp_path / "hosts" / "b", "c-new-b", 2048, 2 * DAY)
    own = _spilled(tmp_path, "c-own", 100, 9 * DAY)
    assert [s.state_dir for s in state_dirs(settings)] == [
        tmp_path, tmp_path / "hosts" / "a", tmp_path / "hosts" / "b"]

    assert gc_command(settings, dry_run=True, as_json=True) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["total_bytes"] == 100  # the configured directory's own
    assert [h["state_dir"] for h in shown["hosts"]] == [
        str(tmp_path / "hosts" / "a"), str(tmp_path / "hosts" / "b")]
    assert shown["all_total_bytes"] == 3 * 1024 * 1024 + 2048 + 100
    assert [r["path"] for r in shown["hosts"][0]["remove"]] == [str(old_a)]
    assert shown["hosts"][1]["remove"] == []

    assert gc_command(settings, dry_run=True, as_json=False) == 0
    text = capsys.readouterr().out
    assert "3.0 MiB" in text and "all 3 directories: 3.0 MiB known" in text
    assert old_a.exists() and own.exists(), "a dry run removes nothing"

    assert gc_command(settings, dry_run=False, as_json=False) == 0
    capsys.readouterr()
    assert not old_a.exists() and not own.exists() and new_b.exists()


def test_gc_without_a_local_fleet_collects_the_configured_directory_only(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, host="unit")
    assert [s.state_dir for s in state_dirs(settings)] == [tmp_path]
