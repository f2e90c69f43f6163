"""What a workspace's calls see: the mount plan its keeper carries out
(`bashfleet.worker.engine.isolate.view`).

Pure functions over what was looked up on the host (`HostRoot`, `ViewSpec`), so every
rule is table-tested here:

- the host is read-only: each entry of `/` is bound read-only (mounts under it too),
  with the host's owners: a workspace's ids are none of them, so their mode bits decide
  what it reads, as for any unprivileged account of the host (never an idmapped mount:
  host root's files shown as the workspace root's would let it read every secret, and
  overlayfs and mounts under `/var` cannot be idmapped at all). With layers, `/` itself
  is an overlay of the workspace's own: new top-level directories are its to make;
- the workspace's directory is read-write at its host path, and so are the roots an
  operator lists as writable (`BASHFLEET_SANDBOX_WRITABLE`); its output directory is
  read-only at its host path (every path a dialect shows is a path a call can read);
- `/tmp` and `/var/tmp` are the workspace's own (directories of its state on the host),
  so are `HOME` and `/dev/shm`; `/dev` is minimal, `/proc` the workspace's;
- hidden (an empty read-only tmpfs, or /dev/null for a file): every bashfleet state
  directory known on this machine, every workspace root and allowed root (other
  workspaces), config and env files, every file a setting names as secret. Hidden wins
  over writable; the workspace's own paths are bound back into what hides them;
- the installed package (and the Python that runs the worker) is read-only even where a
  writable root holds it: a call must never change code the worker runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Step = list[Any]

#: Entries of the host's `/` a view never binds: it has its own.
OWN_ENTRIES = frozenset({"proc", "dev", "tmp"})


@dataclass(frozen=True)
class Entry:
    """One entry of the host's `/`."""

    name: str
    kind: str
    """`dir`, `file` or `link`."""
    target: str = ""
    """A link's target."""


@dataclass(frozen=True)
class ViewSpec:
    """Everything a workspace's view depends on (real, absolute host paths)."""

    root: str
    """The empty directory the new root is built on (in the workspace's state)."""
    workspace: str
    out_dir: str
    tmp: str
    var_tmp: str
    home: str
    """The workspace's HOME directory on the host."""
    home_view: str
    """Where HOME is in the view."""
    entries: tuple[Entry, ...]
    hidden_dirs: tuple[str, ...] = ()
    hidden_files: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    protected: tuple[str, ...] = ()
    mounts: Mapping[str, str] = field(default_factory=dict)
    """View path -> host directory (inside the workspace)."""
    has_var_tmp: bool = True
    layers: str | None = None
    """Where the workspace's own layers are (`upper/`, `work/`, `empty/` in its state):
    its `/` is then an overlay, writable everywhere in its view (None: a read-only host
    view on a tmpfs, as a single-tenant host gives)."""
    image: str | None = None
    """With `layers`: the image root filesystem its `/` stands on (None: the host's)."""
    project: bool = False
    """The workspace's directory (and its mounts) is a project's, owned by the host's run
    user: shown through a map that makes that user the workspace's root (`idbind`), as
    the roots every workspace may write (`writable`) are."""
    prebuilt: bool = False
    """With `layers` over the host: its `/` and the host's system directories
    (`SYSTEM_ENTRIES`) were mounted ahead (`prebuild_steps`) at `root`: not again."""
    lowers: tuple[str, ...] = ()
    """With `layers`: the snapshots it is made from, newest first (each a directory of
    layers named as its own: `root`, `top.<entry>`, `home`, `tmp`, `vartmp`, `work` for
    its directory), read-only between its own upper layers and its base. Its `/tmp`,
    `/var/tmp`, HOME and directory are then overlays too."""
    home_in_root: bool = False
    """HOME is the image's own directory at `home_view`, in the workspace's `/` (its
    layers), not `home` bound over it: the image's dotfiles are there, as in
    `docker exec`."""
    etc_hosts: str | None = None
    """With `layers` over the host: the workspace's own copy of the host's /etc/hosts
    that names the hostname (the host's does not), shown read-only over it."""
    workspace_dir: str | None = None
    """The host directory shown at `workspace` when it is another (a workspace made from
    a snapshot shows its source's path): its upper layer there."""


def inside(path: str, outer: str) -> bool:
    """`path` is `outer` or under it."""
    return path == outer or path.startswith(outer.rstrip("/") + "/")


def outermost(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths with duplicates and those inside another one dropped, sorted."""
    kept: list[str] = []
    for path in sorted(set(paths)):
        if not any(inside(path, outer) for outer in kept):
            kept.append(path)
    return tuple(kept)


def plan_view(spec: ViewSpec) -> list[Step]:
    """The steps that build `spec`'s view, in order (see `bashfleet.worker.engine.isolate.view`)."""
    r = spec.root.rstrip("/")
    steps: list[Step] = [["private"], *_root_steps(spec)]
    if spec.image is None:
        steps += _host_entries(r, spec.entries, spec)
        if spec.etc_hosts is not None:
            steps.append(["bind_file", spec.etc_hosts, f"{r}/etc/hosts", False])
    steps += [["mkdir", f"{r}/tmp", 0o755], _own_step(spec, "tmp", spec.tmp, f"{r}/tmp")]
    if spec.image is not None:
        # The host's /sys, read-only, as a container runtime mounts one.
        steps += [["mkdir", f"{r}/var/tmp", 0o755], ["mkdir", f"{r}/sys", 0o555],
                  ["rbind_ro", "/sys", f"{r}/sys"]]
    if spec.has_var_tmp or spec.image is not None:
        steps.append(_own_step(spec, "vartmp", spec.var_tmp, f"{r}/var/tmp"))
    steps += [["mkdir", f"{r}/dev", 0o755], ["devices", f"{r}/dev"],
              ["mkdir", f"{r}/proc", 0o555], ["proc", f"{r}/proc"]]
    # Hidden wins: a writable root inside any hidden directory is not bound.
    writable_views = [w for w in outermost(spec.writable) if not _hidden_by(w, spec.hidden_dirs)]
    own = [view for view, _, _ in _own_paths(spec)] + writable_views
    # HOME (and a mount) shows another directory than the host's at its view path: the
    # host's paths under it are not in the view, nothing there to hide.
    elsewhere = [view for view, host, _ in _own_paths(spec) if view != host]
    hidden = _hidden_dirs(spec, own, elsewhere)
    # A hidden directory holding one of the workspace's own paths is hidden first, and
    # that path bound back into it; one inside an own path (a state directory in the
    # workspace) is hidden after it is bound, or the bind would show it again.
    inner = [d for d in hidden if any(inside(d, o) and d != o for o in own)]
    outer = [d for d in hidden if d not in inner]
    # Mount points are made where the target lies on a tmpfs of the view (its root, a
    # hiding tmpfs, /tmp) or in a writable directory of the workspace bound before; in a
    # read-only bind of the host they must exist.
    mounts: list[tuple[str, bool]] = [(r, True), (f"{r}/tmp", True)]
    if spec.has_var_tmp or spec.image is not None:
        mounts.append((f"{r}/var/tmp", True))  # the workspace's own, bound already
    if spec.image is None:
        grows = mount_entries(spec)
        mounts += [(f"{r}/{e.name}", e.name in grows) for e in spec.entries
                   if e.kind == "dir" and e.name not in OWN_ENTRIES]
    mounts += [(f"{r}{d}", True) for d in outer]
    steps += [["hide", f"{r}{d}", 0o755] for d in outer]
    for w in writable_views:
        # With layers: the run user's shared roots through the run user's map (`idbind`).
        steps += _bind_own(r, mounts, w, w, True, grow=False, mapped=spec.layers is not None,
                           shared=True)
    for view_path, host_path, writable in _own_paths(spec):
        layer = _layer_name(spec, view_path, host_path)
        if layer is not None:
            target = f"{r}{view_path}"
            if _covering(target, mounts):
                steps.append(["mkdir", target, 0o755])
            steps.append(_own_step(spec, layer, host_path, target))
            mounts.append((target, True))
            continue
        source = host_path
        if spec.lowers and spec.workspace_dir and inside(host_path, spec.workspace_dir) \
                and host_path != spec.workspace_dir:
            # A mount of a snapshot's workspace: its directory as the view shows it (the
            # snapshot's files under the workspace's own), bound after that overlay.
            source = f"{r}{spec.workspace}{host_path[len(spec.workspace_dir):]}"
        steps += _bind_own(r, mounts, view_path, source, writable,
                           mapped=spec.project and _in_project(host_path, spec))
    steps += [["hide", f"{r}{d}", 0o755] for d in inner]
    files = _hidden_files(spec, hidden, own, elsewhere)
    steps += [["bind_file", "/dev/null", f"{r}{f}", False] for f in files]
    steps += [["rbind_ro", p, f"{r}{p}"] for p in _protected(spec, writable_views)]
    steps += [["hide_ro", f"{r}{d}"] for d in hidden]
    steps.append(["pivot", r])
    if spec.layers is None:
        steps.append(["remount_ro", "/"])  # with layers `/` is the workspace's own layer
    return steps


def _root_steps(spec: ViewSpec) -> list[Step]:
    """The view's `/`: a tmpfs (single-tenant), or an overlay whose upper layer is the
    workspace's own, over the image or (for the host) an empty directory its entries'
    own overlays are mounted on."""
    r = spec.root.rstrip("/")
    if spec.layers is None:
        return [["tmpfs", r, 0o755]]
    if spec.prebuilt:
        return []
    lower = [spec.image, True] if spec.image is not None else [f"{spec.layers}/empty", False]
    return [_overlay(spec.layers, "root", lower, r, spec.lowers)]


#: The host's system directories: a blank keeper binds them ahead of its claim (they
#: do not come and go as other entries of `/` may).
SYSTEM_ENTRIES = frozenset({"bin", "etc", "lib", "lib32", "lib64", "libx32", "sbin", "usr",
                            "var"})


def prebuild_steps(layers: str, entries: Sequence[Entry]) -> list[Step]:
    """What a blank keeper builds ahead of its claim: the host's root in layers at
    `<layers>/merged` (its own `/` and the host's system directories bound read-only in
    it), in a mount tree made private first (nothing of it may reach the host's)."""
    merged = f"{layers}/merged"
    steps: list[Step] = [["private"], ["mkdir", merged, 0o755],
                         _overlay(layers, "root", [f"{layers}/empty", False], merged)]
    for entry in sorted(entries, key=lambda e: e.name):
        if entry.kind == "dir" and entry.name in SYSTEM_ENTRIES:
            steps += [["mkdir", f"{merged}/{entry.name}", 0o755],
                      ["rbind_ro", f"/{entry.name}", f"{merged}/{entry.name}"]]
    return steps


def _overlay(layers: str, name: str, lower: list[Any], target: str,
             snapshots: Sequence[str] = ()) -> Step:
    stack = [[f"{snapshot}/{name}", True] for snapshot in snapshots]
    return ["overlay", [*stack, lower], f"{layers}/upper/{name}", f"{layers}/work/{name}",
            target]


#: The name of a workspace's own /etc/hosts in its layers directory (`ViewSpec.etc_hosts`).
ETC_HOSTS = "hosts"

#: The layer a snapshot keeps of each of a workspace's own directories.
OWN_LAYERS = ("home", "tmp", "vartmp", "work")


def _own_step(spec: ViewSpec, layer: str, host: str, target: str) -> Step:
    """One of the workspace's own directories at `target`: bound, or (made from a
    snapshot) an overlay of the snapshots' layers of it under the directory itself."""
    if not spec.lowers:
        return ["bind", host, target, True]
    stack = [[f"{snapshot}/{layer}", True] for snapshot in spec.lowers]
    return ["overlay", stack, host, f"{spec.layers}/work/own.{layer}", target]


def _layer_name(spec: ViewSpec, view_path: str, host_path: str) -> str | None:
    """The snapshot layer of an own path of a workspace made from snapshots (its HOME or
    directory), else None (a bind)."""
    if not spec.lowers:
        return None
    if view_path == spec.home_view and host_path == spec.home:
        return "home"
    if view_path == spec.workspace and host_path == (spec.workspace_dir or spec.workspace):
        return "work"
    return None


def upper_name(entry: str) -> str:
    """The name of a host entry's upper layer under `upper/` (`root` is `/`'s own)."""
    return f"top.{entry}"


def mount_entries(spec: ViewSpec) -> frozenset[str]:
    """Host entries (shown read-only with the host's ids) that hold a mount's view path:
    with layers, each is an overlay of its own (upper `top.<name>`, the host's directory
    its lower as it is), so that a mount point the host has not got can be made there;
    the host's files in it stay the host's, read-only to the workspace as before."""
    if spec.layers is None or spec.image is not None:
        return frozenset()
    dirs = {e.name for e in spec.entries if e.kind == "dir" and e.name not in OWN_ENTRIES}
    return frozenset(name for name in dirs
                     if any(inside(view, f"/{name}") and view != f"/{name}"
                            for view in spec.mounts))


def _host_entries(r: str, entries: Sequence[Entry], spec: ViewSpec) -> list[Step]:
    steps: list[Step] = []
    for_mounts = mount_entries(spec)
    for entry in sorted(entries, key=lambda e: e.name):
        if entry.name in OWN_ENTRIES or "/" in entry.name or entry.name in ("", ".", ".."):
            continue
        path = f"/{entry.name}"
        if entry.kind == "link":
            steps.append(["symlink", entry.target, f"{r}{path}"])
        elif entry.kind == "dir" and entry.name in for_mounts:
            steps += [["mkdir", f"{r}{path}", 0o755],
                      _overlay(str(spec.layers), upper_name(entry.name), [path, False],
                               f"{r}{path}")]
        elif entry.kind == "dir" and spec.prebuilt and entry.name in SYSTEM_ENTRIES:
            continue  # bound ahead
        elif entry.kind == "dir":
            steps += [["mkdir", f"{r}{path}", 0o755], ["rbind_ro", path, f"{r}{path}"]]
        else:
            steps.append(["bind_file", path, f"{r}{path}", False])
    return steps


def _own_paths(spec: ViewSpec) -> list[tuple[str, str, bool]]:
    """(view path, host path, writable) of what is the workspace's own, outer first: its
    HOME, its directory, its outputs, its mounts."""
    own = [] if spec.home_in_root else [(spec.home_view, spec.home, True)]
    own += [(spec.workspace, spec.workspace_dir or spec.workspace, True),
           (spec.out_dir, spec.out_dir, False)]
    own += [(view, host, True) for view, host in sorted(spec.mounts.items())]
    ordered = sorted(own, key=lambda item: (item[0].count("/"), item[0]))
    if spec.lowers and spec.workspace_dir:
        # Mounts of the directory of a workspace made from snapshots are bound from its
        # overlay: after it, wherever their view paths lie.
        def from_dir(item: tuple[str, str, bool]) -> bool:
            return item[1] != spec.workspace_dir and inside(item[1], str(spec.workspace_dir))
        ordered = [o for o in ordered if not from_dir(o)] + [o for o in ordered if from_dir(o)]
    return ordered


def _in_project(host_path: str, spec: ViewSpec) -> bool:
    return inside(host_path, spec.workspace)


def _bind_own(r: str, mounts: list[tuple[str, bool]], view_path: str, host: str,
              writable: bool, *, grow: bool = True, mapped: bool = False,
              shared: bool = False) -> list[Step]:
    """Bind one of the workspace's own paths; its mount point is made when the mount it
    lies on takes new directories (`mounts`: path, whether it does), else it must exist.
    `grow`: mount points of later binds may be made inside this one. `mapped`: through
    the project's id map (`idbind`); `shared`: a root every workspace writes (bound as
    it is where it is open to every user, as /tmp)."""
    target = f"{r}{view_path}"
    steps: list[Step] = []
    if _covering(target, mounts):
        steps.append(["mkdir", target, 0o755])
    if mapped:
        steps.append(["idbind", host, target, True] if shared else ["idbind", host, target])
    else:
        steps.append(["bind", host, target, writable])
    mounts.append((target, writable and grow))
    return steps


def _covering(target: str, mounts: Sequence[tuple[str, bool]]) -> bool:
    """Whether the deepest of `mounts` holding `target` takes new directories."""
    holding = [(len(path), order, grows) for order, (path, grows) in enumerate(mounts)
               if inside(target, path) and path != target]
    # The deepest; of two at one path the later (a hiding tmpfs over a read-only bind of
    # the host's, as `strict` mounts over /home, where HOME is then made).
    return max(holding)[2] if holding else False


def _hidden_dirs(spec: ViewSpec, own: Sequence[str], elsewhere: Sequence[str]
                 ) -> tuple[str, ...]:
    """What hides by a tmpfs, parents first: a hidden directory inside another one is
    left to it, unless one of the workspace's own paths between them is bound back
    (then it must hide again inside that); nothing under the view's own /tmp, /proc and
    /dev, nor under an own path that shows another directory (`elsewhere`: the host's
    are not there to hide)."""
    kept: list[str] = []
    wanted = {d for d in spec.hidden_dirs
              if d not in ("/", "") and _visible_in_view(d, own, elsewhere)}
    for path in sorted(wanted):
        covered = any(inside(path, outer) and not any(
            inside(o, outer) and inside(path, o) for o in own) for outer in kept)
        if not covered:
            kept.append(path)
    return tuple(kept)


def _visible_in_view(path: str, own: Sequence[str], elsewhere: Sequence[str] = ()) -> bool:
    """False for a host path under /tmp, /proc or /dev that no own path of the workspace
    brings into its view (the view's own are not the host's: nothing there to hide; an
    own path itself is the workspace's to see), and for one whose deepest own path shows
    another directory than the host's there (`elsewhere`: HOME, a mount)."""
    holding = [o for o in own if inside(path, o)]
    if holding and max(holding, key=len) in elsewhere:
        return False
    # /var/tmp too: the workspace's own (a secret named there is not in its view; binding
    # /dev/null over a file its private /var/tmp has not got made every call fail).
    in_own_area = any(inside(path, f"/{name}") for name in OWN_ENTRIES) \
        or inside(path, "/var/tmp")
    return not in_own_area or any(inside(path, o) and path != o for o in own)


def _hidden_by(path: str, hidden: Sequence[str]) -> bool:
    return any(inside(path, d) for d in hidden)


def _hidden_files(spec: ViewSpec, hidden: Sequence[str], own: Sequence[str],
                  elsewhere: Sequence[str]) -> tuple[str, ...]:
    """Files hidden by /dev/null: those a hidden directory does not already cover (one of
    the workspace's own paths bound back between them uncovers them)."""
    def covered(path: str) -> bool:
        return any(inside(path, d) and not any(inside(o, d) and inside(path, o) for o in own)
                   for d in hidden)

    return tuple(sorted({f for f in spec.hidden_files
                         if not covered(f) and _visible_in_view(f, own, elsewhere)}))


def _protected(spec: ViewSpec, writable_views: Sequence[str]) -> tuple[str, ...]:
    """Protected paths that a writable bind would otherwise expose read-write."""
    rw = [*writable_views, spec.workspace, *spec.mounts.values(), spec.home]
    return outermost(p for p in spec.protected if any(inside(p, w) for w in rw))


# ------------------------------------------------------------------ the host (impure)


def host_entries(root: str = "/") -> tuple[Entry, ...]:
    """The entries of the host's `/`."""
    found = []
    with os.scandir(root) as listing:
        for item in listing:
            if item.is_symlink():
                found.append(Entry(item.name, "link", os.readlink(item.path)))
            elif item.is_dir(follow_symlinks=False):
                found.append(Entry(item.name, "dir"))
            else:
                found.append(Entry(item.name, "file"))
    return tuple(found)


def existing(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[str], list[str]]:
    """(directories, files) among `paths` that exist, as real paths."""
    dirs, files = [], []
    for path in paths:
        real = os.path.realpath(os.path.expanduser(os.fspath(path)))
        if os.path.isdir(real):
            dirs.append(real)
        elif os.path.exists(real):
            files.append(real)
    return dirs, files
