"""Retention: which files of this host's state directory may go, and removing them.

A worker keeps two kinds of files that nothing else deletes:

- spill files of foreground calls, `<spill_dir>/<call_id>.out|.err|.log|.state`, kept
  when the output was cut (their path is in the call's result) and, for a call that
  was auto-backgrounded on timeout, the job's output while it runs and after;
- background job files, `<jobs_dir>/<job_id>.log|.status.json|.json|.read` (output, how it
  ended, the record) and leftovers of a crash (`.spec.json`, `*.tmp`);
- in a workspace's output directory (`<workspace root>/.out/<id>`: its calls read it),
  the spill files of its calls and the output of its jobs, named as above; it outlives
  the workspace, and goes once empty after the workspace did.

Redis needs no collector: every bashfleet key has a TTL (see `bashfleet.worker.fleet.registry`).

`plan()` is pure: from a snapshot of the files, the jobs and the running calls it
decides what goes and why. Files are removed a *group* at a time, a call's or a job's
files together (an auto-backgrounded job's spill files belong to the job), so a group
is as old as its newest file. A group goes when it is older than `max_age_s`; then
the oldest of the rest go until all known files take at most `max_bytes`. Never
removed, whatever the limits:

- a live job's files: its end is not recorded and its process (or one carrying its
  marker) is alive (`bashfleet.worker.engine.jobs.jobs.is_running`); that covers an
  auto-backgrounded job whose output goes to spill files, which a quiet job may not touch for days;
- the spill files of a running foreground call (it has a running-call file, see
  `bashfleet.worker.fleet.recovery`), however old their modification time: a quiet `sleep 3600`
  writes nothing for an hour;
- any group with a file modified within `min_age_s`: a call or job that is starting
  (its files exist before its records do) or still writing.

Images (`bashfleet.worker.engine.images.images`) are collected by the same command, by their own
limits (`images_max_age_s`, `images_max_bytes`): never one a workspace record of the host names,
nor one used within `min_age_s`; then the least recently used over the size cap.

`scan()` takes the snapshot of this host; `execute()` removes a plan's files, checking
each group again first (a group touched since the plan was made is left alone).
`gc_command()` is `bashfleet gc`: it collects the configured state directory and, under
it, each host directory of a local fleet (`bashfleet up` gives host H the state
directory `<state>/hosts/H`, where its spill and job files are), each with its own plan
and limits as that host's own `gc` would (`gc --dry-run` said "0 B known" while a local
fleet's files filled those).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from bashfleet.worker.engine import running
from bashfleet.worker.engine.images import images
from bashfleet.worker.engine.images.image_meta import last_used, to_collect
from bashfleet.worker.engine.jobs import jobs
from bashfleet.worker.engine.snapshots import snapshot_store, snapshots
from bashfleet.worker.settings import Settings
from bashfleet.worker.wire.models import ImageInfo, JobRecord

Kind = Literal["spill", "job"]
Reason = Literal["max_age", "max_bytes"]
Hold = Literal["live_job", "running_call", "min_age"]

#: `<call_id>.<suffix>` in the spill directory; call ids may contain dots, suffixes
#: are fixed, so the id is everything before the last known suffix.
_SPILL_NAME = re.compile(r"^(?P<key>[A-Za-z0-9_.-]{1,64})\.(?:out|err|log|state|owner)$")
#: `<job_id>.<suffix>` in the jobs directory (job ids have no dots), including the
#: temporary files an interrupted atomic write leaves behind.
_JOB_NAME = re.compile(
    r"^(?P<key>[A-Za-z0-9_-]{1,64})"
    r"\.(?:log|json|status\.json|spec\.json|json\.tmp|status\.json\.[0-9a-f]{32}\.tmp"
    r"|read|read\.lock)$"  # an interactive session's read offset and its lock
)
#: Removed last within a job, so a half-removed job is still found (and finished) next time.
_RECORD_SUFFIX = ".json"


@dataclass(frozen=True)
class StateFile:
    """One file the collector knows by name."""

    path: str
    kind: Kind
    """Spill file of a call, or a file of a background job."""
    key: str
    """The call id (spill) or job id (job) its name carries."""
    size: int
    """Apparent size in bytes."""
    mtime: float
    """Last modification, seconds since the epoch."""


@dataclass(frozen=True)
class JobRef:
    """A background job known on this host, with the files it uses."""

    job_id: str
    call_id: str | None
    """The call it came from: an auto-backgrounded call's spill files are its output."""
    paths: frozenset[str]
    """Output, stderr, status and record paths (anywhere; only ours matter)."""
    live: bool
    """Its end is not recorded and it (or a process carrying its marker) is alive."""


@dataclass(frozen=True)
class RetentionPolicy:
    """What `bashfleet gc` keeps."""

    max_age_s: float
    max_bytes: int
    min_age_s: float

    @classmethod
    def from_settings(
        cls, settings: Settings, *, max_age_s: float | None = None, max_bytes: int | None = None
    ) -> RetentionPolicy:
        """The configured limits, with command-line overrides."""
        return cls(
            max_age_s=settings.retention_max_age_s if max_age_s is None else max_age_s,
            max_bytes=settings.retention_max_bytes if max_bytes is None else max_bytes,
            min_age_s=settings.retention_min_age_s,
        )


@dataclass(frozen=True)
class Inventory:
    """A snapshot of this host's state: known files, jobs and running calls."""

    now: float
    files: tuple[StateFile, ...]
    jobs: tuple[JobRef, ...] = ()
    running_calls: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Group:
    """Files removed together: one call's spill files, or one job's files."""

    name: str
    """`call <id>` or `job <id>`."""
    files: tuple[StateFile, ...]
    call_ids: frozenset[str] = frozenset()
    """Calls whose spill files are in the group."""
    live: bool = False
    """It holds a live job's files."""

    @property
    def size(self) -> int:
        """Bytes of all its files."""
        return sum(f.size for f in self.files)

    @property
    def newest(self) -> float:
        """Modification time of its newest file: the group is as old as that."""
        return max(f.mtime for f in self.files)


@dataclass(frozen=True)
class Removal:
    """A file the plan removes."""

    path: str
    size: int
    mtime: float
    """As planned: a file changed since then is not removed."""
    age_s: float
    reason: Reason
    group: str


@dataclass(frozen=True)
class Held:
    """A group that is kept whatever the limits say, and why."""

    group: str
    size: int
    age_s: float
    reason: Hold


@dataclass(frozen=True)
class Plan:
    """What to remove, what is held, and the sizes before and after."""

    limits: RetentionPolicy
    removals: tuple[Removal, ...]
    held: tuple[Held, ...]
    total_bytes: int
    """Bytes of every known file now."""

    @property
    def freed_bytes(self) -> int:
        """Bytes the removals free."""
        return sum(r.size for r in self.removals)

    @property
    def remaining_bytes(self) -> int:
        """Bytes of the known files once the plan ran."""
        return self.total_bytes - self.freed_bytes


# ----------------------------------------------------------------------- planning


def classify(path: Path, kind: Kind) -> str | None:
    """The call or job id a file's name carries; None for a name we do not own."""
    match = (_SPILL_NAME if kind == "spill" else _JOB_NAME).match(path.name)
    return match["key"] if match else None


def group_files(inventory: Inventory) -> list[Group]:
    """The files as groups: per call, per job; a job takes the spill files it uses."""
    by_key: dict[tuple[Kind, str], list[StateFile]] = {}
    owner: dict[str, tuple[Kind, str]] = {}
    for item in inventory.files:
        by_key.setdefault((item.kind, item.key), []).append(item)
        owner[item.path] = (item.kind, item.key)
    groups: list[Group] = []
    for ref in inventory.jobs:
        # Its own files, and the spill files it writes (an auto-backgrounded call's).
        keys = {("job", ref.job_id)} | {owner[p] for p in ref.paths if p in owner}
        if ref.call_id is not None:
            keys.add(("spill", ref.call_id))
        files: list[StateFile] = []
        calls: set[str] = set()
        for key in sorted(keys):
            if key in by_key:
                files += by_key.pop(key)
                if key[0] == "spill":
                    calls.add(key[1])
        if files:
            groups.append(
                Group(f"job {ref.job_id}", tuple(files), frozenset(calls), live=ref.live)
            )
    for (kind, name), rest in by_key.items():
        # A call that never became a job, or job files without a readable record.
        if kind == "spill":
            groups.append(Group(f"call {name}", tuple(rest), frozenset({name})))
        else:
            groups.append(Group(f"job {name}", tuple(rest)))
    return groups


def _hold(group: Group, inventory: Inventory, limits: RetentionPolicy) -> Hold | None:
    if group.live:
        return "live_job"
    if group.call_ids & inventory.running_calls:
        return "running_call"
    # A clock step back makes an age negative: that is young, too.
    if inventory.now - group.newest < limits.min_age_s:
        return "min_age"
    return None


def plan(inventory: Inventory, limits: RetentionPolicy) -> Plan:
    """Decide what to remove: past the age limit, then the oldest over the size cap."""
    now = inventory.now
    groups = group_files(inventory)
    total = sum(g.size for g in groups)
    held: list[Held] = []
    candidates: list[Group] = []
    for group in groups:
        reason = _hold(group, inventory, limits)
        if reason is None:
            candidates.append(group)
        else:
            held.append(Held(group.name, group.size, now - group.newest, reason))
    # Oldest first; the name breaks ties so the same state always gives the same plan.
    candidates.sort(key=lambda g: (g.newest, g.name))
    chosen: list[tuple[Group, Reason]] = []
    remaining = total
    for group in candidates:
        if now - group.newest > limits.max_age_s:
            chosen.append((group, "max_age"))
            remaining -= group.size
    for group in candidates:
        if remaining <= limits.max_bytes:
            break
        if now - group.newest <= limits.max_age_s:
            chosen.append((group, "max_bytes"))
            remaining -= group.size
    removals = tuple(
        Removal(f.path, f.size, f.mtime, now - f.mtime, reason, group.name)
        for group, reason in chosen
        for f in sorted(group.files, key=_removal_order)
    )
    held.sort(key=lambda h: h.group)
    return Plan(limits, removals, tuple(held), total)


def _removal_order(item: StateFile) -> tuple[bool, str]:
    # The job record last: while it exists, a half-removed job is found and grouped.
    is_record = item.kind == "job" and Path(item.path).name == f"{item.key}{_RECORD_SUFFIX}"
    return is_record, item.path


# ------------------------------------------------------------------------ the host


def _listing(folder: Path, kind: Kind) -> list[StateFile]:
    found: list[StateFile] = []
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return found
    for entry in entries:
        key = classify(Path(entry.name), kind)
        if key is None:
            continue  # not a name we own: never ours to remove
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            info = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            continue  # removed while we looked
        path = os.path.abspath(entry.path)
        found.append(StateFile(path, kind, key, info.st_size, info.st_mtime))
    return found


def _job_ref(record: JobRecord, settings: Settings) -> JobRef:
    named = [record.output_path, record.status_path, str(jobs.record_path(settings, record.id))]
    if record.stderr_path:
        named.append(record.stderr_path)
    # Compared with the listing's absolute paths (a relative BASHFLEET_STATE_DIR).
    paths = {os.path.abspath(p) for p in named}
    live = jobs.read_status(record) is None and jobs.is_running(record)
    return JobRef(record.id, record.call_id, frozenset(paths), live)


def workspace_outputs(settings: Settings) -> list[Path]:
    """The output directories of this host's workspaces, those deleted included (their
    kept output outlives them): each has a marker in the state directory naming it (the
    state directory is never shared by two fleets; their workspace root may be)."""
    found = []
    with contextlib.suppress(OSError), os.scandir(settings.workspaces_dir) as listing:
        for entry in listing:
            if entry.name.endswith(".out") and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    found.append(Path(Path(entry.path).read_text("utf-8").strip()))
    return found


def drop_empty_outputs(settings: Settings) -> None:
    """Remove the output directories of deleted workspaces that hold nothing any more
    (and their markers)."""
    for folder in workspace_outputs(settings):
        ws_id = folder.name
        if (settings.workspaces_dir / f"{ws_id}.json").exists():
            continue  # a live workspace: its output directory stays
        with contextlib.suppress(OSError):
            if folder.exists():
                folder.rmdir()
            (settings.workspaces_dir / f"{ws_id}.out").unlink()


def scan(settings: Settings, now: float | None = None) -> Inventory:
    """This host's known files, its jobs (live or not) and its running calls."""
    # Files first, then who uses them: a call or job that starts after the listing has
    # no files in it (the other order would list a new job's log without its record).
    # One that ends meanwhile may lose its files in this pass rather than the next, and
    # only those the limits would take anyway.
    files = _listing(settings.spill_dir, "spill") + _listing(settings.jobs_dir, "job")
    for folder in workspace_outputs(settings):
        files += _listing(folder, "spill")
    refs = tuple(_job_ref(record, settings) for record in jobs.local_records(settings))
    live = frozenset(entry.call_id for entry in running.all_calls(settings))
    return Inventory(
        now=time.time() if now is None else now, files=tuple(files), jobs=refs,
        running_calls=live,
    )


@dataclass
class Outcome:
    """What `execute` did."""

    removed: list[Removal] = field(default_factory=list)
    skipped: list[tuple[Removal, str]] = field(default_factory=list)
    """Not removed, and why (gone already, or its group changed since the plan)."""
    errors: list[tuple[Removal, str]] = field(default_factory=list)


def execute(done_plan: Plan) -> Outcome:
    """Remove a plan's files, a group at a time, leaving groups changed since."""
    outcome = Outcome()
    for _, removals in _by_group(done_plan.removals):
        changed = _changed(removals)
        for removal in removals:
            if changed:
                outcome.skipped.append((removal, changed))
                continue
            try:
                os.unlink(removal.path)
            except FileNotFoundError:
                outcome.skipped.append((removal, "already gone"))
            except OSError as exc:
                outcome.errors.append((removal, exc.strerror or str(exc)))
            else:
                outcome.removed.append(removal)
    return outcome


def _by_group(removals: Iterable[Removal]) -> list[tuple[str, list[Removal]]]:
    grouped: dict[str, list[Removal]] = {}
    for removal in removals:
        grouped.setdefault(removal.group, []).append(removal)
    return list(grouped.items())


def _changed(removals: Sequence[Removal]) -> str | None:
    # A file written since the plan means the group is in use again (a late completion
    # line, a job's status): keep the whole group and decide next time.
    for removal in removals:
        try:
            info = os.lstat(removal.path)
        except FileNotFoundError:
            continue
        if info.st_size != removal.size or info.st_mtime != removal.mtime:
            return "changed since the plan was made"
    return None


# ------------------------------------------------------------------------- the CLI


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover - the loop returns


def _age(seconds: float) -> str:
    if seconds >= 86400:
        return f"{seconds / 86400:.1f}d"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f}h"
    if seconds >= 60:
        return f"{seconds / 60:.0f}m"
    return f"{seconds:.0f}s"


_REASONS = {
    "max_age": "older than the age limit",
    "max_bytes": "oldest over the size cap",
    "live_job": "a live job's",
    "running_call": "a running call's",
    "min_age": "modified too recently",
}


def report(
    state_dir: Path, done_plan: Plan, outcome: Outcome | None
) -> dict[str, object]:
    """The plan (and what was done) as JSON-able data: what `gc --json` prints."""
    limits = done_plan.limits
    return {
        "state_dir": str(state_dir),
        "dry_run": outcome is None,
        "limits": {
            "max_age_s": limits.max_age_s, "max_bytes": limits.max_bytes,
            "min_age_s": limits.min_age_s,
        },
        "total_bytes": done_plan.total_bytes,
        "remaining_bytes": done_plan.remaining_bytes,
        "over_cap": done_plan.remaining_bytes > limits.max_bytes,
        "remove": [
            {"path": r.path, "size": r.size, "age_s": round(r.age_s, 3), "reason": r.reason,
             "group": r.group}
            for r in done_plan.removals
        ],
        "held": [
            {"group": h.group, "size": h.size, "age_s": round(h.age_s, 3), "reason": h.reason}
            for h in done_plan.held
        ],
        "removed": [r.path for r in outcome.removed] if outcome else [],
        "skipped": [{"path": r.path, "why": why} for r, why in outcome.skipped] if outcome else [],
        "errors": [{"path": r.path, "error": e} for r, e in outcome.errors] if outcome else [],
    }


def _print_text(state_dir: Path, done_plan: Plan, outcome: Outcome | None) -> None:
    verb = "would remove" if outcome is None else "removing"
    limits = done_plan.limits
    if done_plan.removals:
        print(f"{verb} {len(done_plan.removals)} file(s), {_size(done_plan.freed_bytes)}:")
        rows = [
            (r.path, _size(r.size), _age(r.age_s), _REASONS[r.reason])
            for r in done_plan.removals
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(3)]
        for path, size, age, why in rows:
            print(f"  {path.ljust(widths[0])}  {size.rjust(widths[1])}  "
                  f"{age.rjust(widths[2])}  {why}")
    else:
        print("nothing to remove")
    if done_plan.held:
        counts: dict[str, int] = {}
        for item in done_plan.held:
            counts[item.reason] = counts.get(item.reason, 0) + 1
        kinds = ", ".join(f"{n} {_REASONS[reason]}" for reason, n in sorted(counts.items()))
        print(f"kept in use: {len(done_plan.held)} group(s) ({kinds})")
    print(
        f"{state_dir}: {_size(done_plan.total_bytes)} known, "
        f"{_size(done_plan.remaining_bytes)} after "
        f"(limits: age {_age(limits.max_age_s)}, size {_size(limits.max_bytes)}, "
        f"untouched under {_age(limits.min_age_s)})"
    )
    if outcome is not None:
        for removal, why in outcome.skipped:
            print(f"skipped {removal.path}: {why}")
        for removal, error in outcome.errors:
            print(f"could not remove {removal.path}: {error}", file=sys.stderr)


@dataclass(frozen=True)
class ImageCollection:
    """What `gc` did (or would do) to a state directory's images."""

    held: tuple[ImageInfo, ...]
    chosen: tuple[ImageInfo, ...]
    """Removed, or with `dry_run` to be removed, least recently used first."""
    in_use: int
    """Held images a workspace record names."""
    dry_run: bool

    def as_dict(self, now: float) -> dict[str, object]:
        """As `gc --json` prints it under `images`."""
        return {
            "held": len(self.held), "held_bytes": sum(i.size_bytes for i in self.held),
            "in_use": self.in_use,
            "remove": [{"ref": info.ref, "digest": info.digest, "size": info.size_bytes,
                        "unused_s": round(now - last_used(info), 3)} for info in self.chosen],
            "removed": [] if self.dry_run else [info.digest for info in self.chosen],
        }

    def print_text(self) -> None:
        verb = "would remove" if self.dry_run else "removed"
        if self.chosen:
            print(f"images: {verb} {len(self.chosen)} "
                  f"({_size(sum(i.size_bytes for i in self.chosen))}): "
                  + ", ".join(info.ref for info in self.chosen))
        print(f"images: {len(self.held)} held ({_size(sum(i.size_bytes for i in self.held))})"
              f", {self.in_use} in use by workspaces")


def collect_images(settings: Settings, *, dry_run: bool) -> ImageCollection:
    """Collect the unused images of a state directory's store (with `dry_run`, only
    choose them): by `images_max_age_s` and `images_max_bytes`, sparing those in use and
    those used within `retention_min_age_s`."""
    if not (settings.state_dir / "images").is_dir():
        return ImageCollection((), (), 0, dry_run)  # no store here: none made for nothing
    busy, held = images.in_use(settings), tuple(images.held(settings))
    if dry_run:
        chosen = to_collect(held, now=time.time(), max_age_s=settings.images_max_age_s,
                            max_bytes=settings.images_max_bytes, in_use=busy,
                            min_age_s=settings.retention_min_age_s)
    else:
        chosen = images.collect(settings, max_age_s=settings.images_max_age_s,
                                max_bytes=settings.images_max_bytes, in_use=busy)
    in_use = len({info.digest for info in held} & busy)
    return ImageCollection(held, tuple(chosen), in_use, dry_run)


def collect_snapshots(settings: Settings, *, dry_run: bool) -> dict[str, int | list[str]]:
    """Remove the snapshots past their TTL (or deleted) that nothing stands on any more,
    on this host and, for those it pushed, in the fleet's registry (`dry_run`: only say
    which); as `gc --json` prints it under `snapshots`."""
    if not snapshot_store.snapshots_dir(settings).is_dir():
        return {"held": 0, "removed": []}
    if dry_run:
        chosen = [record.id for record in snapshots.collectable(settings)]
    else:
        chosen = [record.id for record in snapshots.collect(settings)]
    return {"held": len(snapshot_store.local_records(settings)),
            "remove" if dry_run else "removed": chosen}


def state_dirs(settings: Settings) -> list[Settings]:
    """The settings of each state directory `gc` collects: the configured one, then
    those of a local fleet's hosts under it (`<state>/hosts/<host>`), by host id."""
    hosts = settings.state_dir / "hosts"
    try:
        found = sorted(entry for entry in hosts.iterdir()
                       if entry.is_dir() and not entry.is_symlink())
    except OSError:  # no local fleet here
        found = []
    return [settings] + [settings.model_copy(update={"state_dir": path}) for path in found]


def gc_command(
    settings: Settings,
    *,
    dry_run: bool,
    as_json: bool,
    max_age_s: float | None = None,
    max_bytes: int | None = None,
) -> int:
    """`bashfleet gc`: plan, print, remove unless `dry_run`, for each state directory
    (`state_dirs`); 1 when a removal failed.

    `--json` prints the configured directory's report, with `hosts`: the reports of the
    local fleet's host directories, and `all_total_bytes` / `all_remaining_bytes` over
    all of them."""
    reports: list[dict[str, object]] = []
    failed = False
    for index, each in enumerate(state_dirs(settings)):
        limits = RetentionPolicy.from_settings(each, max_age_s=max_age_s, max_bytes=max_bytes)
        done_plan = plan(scan(each), limits)
        outcome = None if dry_run else execute(done_plan)
        if not dry_run:
            drop_empty_outputs(each)
        failed = failed or bool(outcome is not None and outcome.errors)
        reports.append(report(each.state_dir, done_plan, outcome))
        collected = collect_images(each, dry_run=dry_run)
        reports[-1]["images"] = collected.as_dict(time.time())
        snaps = collect_snapshots(each, dry_run=dry_run)
        reports[-1]["snapshots"] = snaps
        if not as_json:
            if index == 1:
                print("\nthe local fleet's hosts:")
            _print_text(each.state_dir, done_plan, outcome)
            collected.print_text()
            gone = snaps.get("remove", snaps.get("removed")) or []
            if isinstance(gone, list) and gone:
                verb = "would remove" if dry_run else "removed"
                print(f"snapshots: {verb} {len(gone)}: " + ", ".join(gone))
    if as_json:
        main, *hosts = reports
        print(json.dumps({
            **main, "hosts": hosts,
            "all_total_bytes": sum(_bytes(r, "total_bytes") for r in reports),
            "all_remaining_bytes": sum(_bytes(r, "remaining_bytes") for r in reports),
        }, indent=2))
    elif len(reports) > 1:
        total = sum(_bytes(r, "total_bytes") for r in reports)
        left = sum(_bytes(r, "remaining_bytes") for r in reports)
        print(f"\nall {len(reports)} directories: {_size(total)} known, {_size(left)} after")
    return 1 if failed else 0


def _bytes(data: dict[str, object], key: str) -> int:
    value = data[key]
    return value if isinstance(value, int) else 0


def build_parser() -> argparse.ArgumentParser:
    """`bashfleet gc` (and `python -m bashfleet.worker.retention`) arguments."""
    parser = argparse.ArgumentParser(
        prog="bashfleet gc", description="Remove old spill and job files of this machine's "
        "worker, the images no workspace uses (BASHFLEET_IMAGES_MAX_AGE_S, _MAX_BYTES), and "
        "the snapshots past their TTL (or deleted) that no workspace stands on (from the "
        "fleet's registry too)."
    )
    parser.add_argument("--dry-run", action="store_true", help="only show what would be removed")
    parser.add_argument("--json", action="store_true", help="print the plan (and what was "
                        "removed) as JSON")
    parser.add_argument("--max-age", type=float, metavar="S",
                        help="seconds (default: BASHFLEET_RETENTION_MAX_AGE_S, 7 days)")
    parser.add_argument("--max-bytes", type=int, metavar="N",
                        help="size cap (default: BASHFLEET_RETENTION_MAX_BYTES, 10 GiB)")
    return parser


def cli(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m bashfleet.worker.retention` (what `bashfleet gc` runs)."""
    args = build_parser().parse_args(argv)
    return gc_command(
        Settings(), dry_run=args.dry_run, as_json=args.json, max_age_s=args.max_age,
        max_bytes=args.max_bytes,
    )


if __name__ == "__main__":
    sys.exit(cli())
