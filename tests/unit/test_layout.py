"""bashfleet.worker.engine.layout: what a workspace's calls see, as a plan of mount steps."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bashfleet.worker.engine import layout
from bashfleet.worker.engine.layout import Entry, ViewSpec

R = "/state/workspaces/w1/root"
ENTRIES = (Entry("usr", "dir"), Entry("etc", "dir"), Entry("var", "dir"), Entry("home", "dir"),
           Entry("bin", "link", "usr/bin"), Entry("tmp", "dir"), Entry("proc", "dir"),
           Entry("dev", "dir"), Entry("swapfile", "file"), Entry("srv", "dir"))


def spec(**changes: Any) -> ViewSpec:
    base: dict[str, Any] = dict(
        root=R, workspace="/srv/ws/w1", out_dir="/srv/ws/.out/w1", tmp="/state/workspaces/w1/tmp",
        var_tmp="/state/workspaces/w1/vartmp", home="/state/workspaces/w1/home",
        home_view="/home/runner", entries=ENTRIES,
        hidden_dirs=("/state", "/srv/ws", "/etc/bashfleet"), hidden_files=("/etc/key",),
    )
    base.update(changes)
    return ViewSpec(**base)


def binds(plan: list[list[Any]]) -> dict[str, tuple[str, bool]]:
    """target -> (source, writable) of the plan's bind steps."""
    found: dict[str, tuple[str, bool]] = {}
    for step in plan:
        if step[0] == "bind":
            found[step[2]] = (step[1], bool(step[3]))
        elif step[0] == "rbind_ro":
            found[step[2]] = (step[1], False)
    return found


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        (["/a/b", "/a", "/c"], ("/a", "/c")),
        (["/a", "/ab"], ("/a", "/ab")),
        (["/x/y", "/x/y"], ("/x/y",)),
        ([], ()),
    ],
)
def test_outermost(paths: list[str], expected: tuple[str, ...]) -> None:
    assert layout.outermost(paths) == expected


def test_the_host_is_read_only_and_its_own_dirs_are_not_the_hosts() -> None:
    plan = layout.plan_view(spec())
    found = binds(plan)
    assert found[f"{R}/usr"] == ("/usr", False)
    assert found[f"{R}/etc"] == ("/etc", False)
    assert ["symlink", "usr/bin", f"{R}/bin"] in plan
    assert ["bind_file", "/swapfile", f"{R}/swapfile", False] in plan
    for own in ("tmp", "proc", "dev"):  # never the host's
        assert found.get(f"{R}/{own}", ("", True))[0] != f"/{own}"
    assert found[f"{R}/tmp"] == ("/state/workspaces/w1/tmp", True)
    assert found[f"{R}/var/tmp"] == ("/state/workspaces/w1/vartmp", True)
    assert ["devices", f"{R}/dev"] in plan and ["proc", f"{R}/proc"] in plan


def test_the_workspace_and_home_are_writable_its_output_read_only() -> None:
    found = binds(layout.plan_view(spec()))
    assert found[f"{R}/srv/ws/w1"] == ("/srv/ws/w1", True)
    assert found[f"{R}/srv/ws/.out/w1"] == ("/srv/ws/.out/w1", False)
    assert found[f"{R}/home/runner"] == ("/state/workspaces/w1/home", True)


def test_mount_points_are_made_on_the_views_tmpfs_never_in_a_host_bind() -> None:
    plan = layout.plan_view(spec(home_view="/home/runner", mounts={"/logs": "/srv/ws/w1/l"}))
    assert ["mkdir", f"{R}/home/runner", 0o755] not in plan  # /home is the host's: must exist
    assert ["mkdir", f"{R}/logs", 0o755] in plan  # on the view's own root
    plan = layout.plan_view(spec(home_view="/nonexistent"))
    assert ["mkdir", f"{R}/nonexistent", 0o755] in plan


def test_hidden_dirs_are_covered_and_the_workspace_is_bound_back_into_them() -> None:
    plan = layout.plan_view(spec())
    tmpfs = [s[1] for s in plan if s[0] == "hide"]
    assert f"{R}/state" in tmpfs and f"{R}/srv/ws" in tmpfs
    hidden_at = plan.index(["hide", f"{R}/srv/ws", 0o755])
    made = plan.index(["mkdir", f"{R}/srv/ws/w1", 0o755])
    bound = next(i for i, s in enumerate(plan) if s[0] == "bind" and s[2] == f"{R}/srv/ws/w1")
    assert hidden_at < made < bound
    assert ["hide_ro", f"{R}/srv/ws"] in plan
    assert ["bind_file", "/dev/null", f"{R}/etc/key", False] in plan


def test_secrets_inside_the_workspace_stay_hidden() -> None:
    plan = layout.plan_view(spec(hidden_dirs=("/srv/ws", "/srv/ws/w1/.state"),
                                 hidden_files=("/srv/ws/w1/signing.key",)))
    bound = next(i for i, s in enumerate(plan) if s[0] == "bind" and s[2] == f"{R}/srv/ws/w1")
    state = plan.index(["hide", f"{R}/srv/ws/w1/.state", 0o755])
    key = plan.index(["bind_file", "/dev/null", f"{R}/srv/ws/w1/signing.key", False])
    assert bound < state and bound < key


def test_hidden_wins_over_writable_but_not_over_the_workspaces_own() -> None:
    found = binds(layout.plan_view(spec(writable=("/state/cache", "/opt/cache"))))
    assert f"{R}/state/cache" not in found
    assert found[f"{R}/opt/cache"] == ("/opt/cache", True)


def test_nothing_under_the_views_own_tmp_is_hidden_from_the_host() -> None:
    plan = layout.plan_view(spec(hidden_dirs=("/tmp/pytest-1/state",),
                                 hidden_files=("/tmp/key",)))
    assert not any(s[0] in ("tmpfs", "hide") and s[1].startswith(f"{R}/tmp/") for s in plan)
    assert not any(s[0] == "bind_file" and s[2] == f"{R}/tmp/key" for s in plan)


def test_a_workspace_under_tmp_is_bound_into_the_private_tmp() -> None:
    plan = layout.plan_view(spec(workspace="/tmp/t/ws", out_dir="/tmp/t/.out/w1"))
    assert ["mkdir", f"{R}/tmp/t/ws", 0o755] in plan
    assert binds(plan)[f"{R}/tmp/t/ws"] == ("/tmp/t/ws", True)


@pytest.mark.parametrize("hidden", ["/home/runner/.local/state/bashfleet", "/home/runner",
                                    "/logs/.secret"])
def test_nothing_hides_under_a_path_that_shows_another_directory(hidden: str) -> None:
    # A worker that is not root runs calls as itself: its own state directory lies in the
    # HOME the view replaces by the workspace's. Hiding it there made a mount point that
    # does not exist in the private HOME (the quickstart as a non-root user failed).
    plan = layout.plan_view(spec(hidden_dirs=(hidden,), mounts={"/logs": "/srv/ws/w1/logs"}))
    assert not any(step[0] in ("tmpfs", "hide") and step[1] == f"{R}{hidden}" for step in plan)
    assert binds(plan)[f"{R}/home/runner"] == ("/state/workspaces/w1/home", True)


def test_mounts_show_workspace_dirs_at_absolute_paths() -> None:
    plan = layout.plan_view(spec(mounts={"/logs": "/srv/ws/w1/logs",
                                         "/logs/agent": "/srv/ws/w1/agent"}))
    found = binds(plan)
    assert found[f"{R}/logs"] == ("/srv/ws/w1/logs", True)
    assert found[f"{R}/logs/agent"] == ("/srv/ws/w1/agent", True)
    assert plan.index(["mkdir", f"{R}/logs", 0o755]) < plan.index(["mkdir", f"{R}/logs/agent",
                                                                  0o755])


def test_the_package_stays_read_only_inside_a_writable_workspace() -> None:
    plan = layout.plan_view(spec(workspace="/srv/src", protected=("/srv/src/.venv", "/usr/lib")))
    assert ["rbind_ro", "/srv/src/.venv", f"{R}/srv/src/.venv"] in plan
    assert not any(s[0] == "rbind_ro" and s[1] == "/usr/lib" for s in plan)  # ro already


def test_the_plan_ends_with_the_pivot_and_a_read_only_root() -> None:
    plan = layout.plan_view(spec())
    assert plan[0] == ["private"] and plan[1] == ["tmpfs", R, 0o755]
    assert plan[-2:] == [["pivot", R], ["remount_ro", "/"]]


paths = st.lists(st.sampled_from(["/srv", "/srv/ws", "/state", "/opt", "/opt/x", "/home",
                                  "/home/runner", "/etc", "/tmp/a", "/var"]), max_size=5)


@settings(max_examples=200, deadline=None)
@given(hidden=paths, writable=paths, protected=paths)
def test_no_host_path_is_writable_but_the_workspaces_own_and_the_listed_roots(
    hidden: list[str], writable: list[str], protected: list[str],
) -> None:
    view = spec(hidden_dirs=tuple(hidden), writable=tuple(writable), protected=tuple(protected))
    plan = layout.plan_view(view)
    own = {view.workspace, view.tmp, view.var_tmp, view.home}
    for source, writable_bind in binds(plan).values():
        if writable_bind:
            assert source in own or source in writable, source
    for step in plan:  # every hidden directory outside the private /tmp is covered
        assert step[0] != "bind" or not step[3] or not any(
            layout.inside(step[1], h) and step[1] not in own for h in hidden)
    covered = {s[1] for s in plan if s[0] == "hide"}
    for h in layout.outermost(hidden):
        # Under the private HOME the host's paths are not in the view: nothing to hide.
        if not layout.inside(h, "/tmp") and not layout.inside(h, view.home_view):
            assert f"{R}{h}" in covered
    last_bind = max(i for i, s in enumerate(plan) if s[0] == "bind")
    for i, step in enumerate(plan):  # what hides inside an own path comes after its bind
        if step[0] == "hide" and any(layout.inside(step[1], f"{R}{o}") and step[1] != f"{R}{o}"
                                      for o in (view.workspace, view.home_view)):
            assert i > last_bind
    assert plan[-2][0] == "pivot"


L = "/state/workspaces/w1/layer"


def overlays(plan: list[list[Any]]) -> dict[str, list[Any]]:
    """target -> (lowers, upper) of the plan's overlay steps."""
    return {step[4]: [step[1], step[2]] for step in plan if step[0] == "overlay"}


def test_with_layers_root_is_an_overlay_and_every_host_dir_read_only_with_its_ids() -> None:
    """The host's directories, system ones included, are read-only binds with the host's
    owners (mode bits decide what the workspace reads); nothing of the host is an
    idmapped lower, which would make host root's files the workspace root's."""
    plan = layout.plan_view(spec(layers=L))
    found = overlays(plan)
    assert found == {R: [[[f"{L}/empty", False]], f"{L}/upper/root"]}
    for name in ("usr", "etc", "var", "home", "srv"):
        assert binds(plan)[f"{R}/{name}"] == (f"/{name}", False)
    assert not any(step[0] == "overlay" and any(idmapped for _, idmapped in step[1])
                   for step in plan)
    assert binds(plan)[f"{R}/srv"] == ("/srv", False)
    # `/` is the workspace's own layer: never made read-only after the pivot.
    assert plan[-1] == ["pivot", R]
    # Hidden still wins inside an overlay.
    assert ["bind_file", "/dev/null", f"{R}/etc/key", False] in plan


def test_with_an_image_its_root_is_the_only_lower_and_no_host_entry_is_shown() -> None:
    plan = layout.plan_view(spec(layers=L, image="/images/rootfs/abc", entries=ENTRIES,
                                 hidden_dirs=(), hidden_files=()))
    found = overlays(plan)
    assert list(found) == [R]
    assert found[R] == [[["/images/rootfs/abc", True]], f"{L}/upper/root"]
    shown = binds(plan)
    assert not any(target in shown for target in (f"{R}/usr", f"{R}/home", f"{R}/srv"))
    assert shown[f"{R}/var/tmp"] == ("/state/workspaces/w1/vartmp", True)
    assert ["mkdir", f"{R}/srv/ws/w1", 0o755] in plan  # made in its own layer


def test_a_projects_directory_is_bound_through_its_id_map() -> None:
    plan = layout.plan_view(spec(layers=L, project=True, workspace="/srv/app",
                                 mounts={"/logs": "/srv/app/logs"}))
    assert ["idbind", "/srv/app", f"{R}/srv/app"] in plan
    assert ["idbind", "/srv/app/logs", f"{R}/logs"] in plan


def test_a_root_every_workspace_writes_is_marked_shared_a_projects_directory_is_not() -> None:
    """The keeper binds a shared root as it is where every user may write it (a root's
    1777 cache: each workspace's files its own ids'); a project's is always mapped."""
    plan = layout.plan_view(spec(layers=L, project=True, workspace="/srv/app",
                                 writable=("/var/cache/shared",)))
    assert ["idbind", "/var/cache/shared", f"{R}/var/cache/shared", True] in plan
    assert ["idbind", "/srv/app", f"{R}/srv/app"] in plan


@pytest.mark.parametrize("secret", ["/var/tmp/key", "/tmp/key"])
def test_a_secret_in_the_workspaces_own_temporary_dirs_is_not_looked_for(secret: str) -> None:
    plan = layout.plan_view(spec(hidden_files=(secret,)))
    assert not any(step[0] == "bind_file" and step[2] == f"{R}{secret}" for step in plan)


def test_home_under_a_hidden_host_directory_is_made_on_the_hiding_tmpfs() -> None:
    # `strict` hides /home; a worker whose HOME is /home/bob gets its own there.
    plan = layout.plan_view(spec(home_view="/home/bob", hidden_dirs=("/home", "/state")))
    bind = ["bind", "/state/workspaces/w1/home", f"{R}/home/bob", True]
    assert bind in plan
    assert ["mkdir", f"{R}/home/bob", 0o755] in plan[:plan.index(bind)]
    assert plan.index(["hide", f"{R}/home", 0o755]) < plan.index(bind)


S1, S2 = "/state/snapshots/s1/layer", "/state/snapshots/s2/layer"


def test_made_from_snapshots_every_own_layer_stands_on_theirs() -> None:
    """A workspace made from a snapshot (of a fork: two of them, newest first): each of
    its overlays has the snapshots' layer of it over its base; its /tmp, /var/tmp, HOME
    and directory are overlays of theirs under its own directories; its directory is
    shown at the source's path, its changes kept in its own."""
    plan = layout.plan_view(spec(layers=L, lowers=(S2, S1), workspace_dir="/srv/ws/w2"))
    found = overlays(plan)
    assert found[R] == [[[f"{S2}/root", True], [f"{S1}/root", True], [f"{L}/empty", False]],
                        f"{L}/upper/root"]
    assert binds(plan)[f"{R}/usr"] == ("/usr", False)  # the host's, as in any workspace
    own = {"tmp": ("/state/workspaces/w1/tmp", f"{R}/tmp"),
           "vartmp": ("/state/workspaces/w1/vartmp", f"{R}/var/tmp"),
           "home": ("/state/workspaces/w1/home", f"{R}/home/runner"),
           "work": ("/srv/ws/w2", f"{R}/srv/ws/w1")}
    for name, (upper, target) in own.items():
        assert found[target] == [[[f"{S2}/{name}", True], [f"{S1}/{name}", True]], upper]
        assert next(s for s in plan if s[0] == "overlay" and s[-1] == target)[3] == \
            f"{L}/work/own.{name}"
    # Nothing of its own is bound from the host any more: they are all overlays.
    assert not any(src in ("/srv/ws/w2", "/srv/ws/w1") for src, _ in binds(plan).values())


def test_a_snapshots_mounts_are_bound_from_its_directory_as_shown() -> None:
    plan = layout.plan_view(spec(layers=L, lowers=(S1,), workspace_dir="/srv/ws/w2",
                                 mounts={"/logs": "/srv/ws/w2/logs"}))
    bound = binds(plan)
    assert bound[f"{R}/logs"] == (f"{R}/srv/ws/w1/logs", True)
    # Bound after the overlay that shows it.
    order = [s[-1] if s[0] == "overlay" else s[2] for s in plan if s[0] in ("overlay", "bind")]
    assert order.index(f"{R}/srv/ws/w1") < order.index(f"{R}/logs")


def test_without_snapshots_the_own_directories_are_binds_as_before() -> None:
    plan = layout.plan_view(spec(layers=L))
    assert binds(plan)[f"{R}/tmp"] == ("/state/workspaces/w1/tmp", True)
    assert binds(plan)[f"{R}/srv/ws/w1"] == ("/srv/ws/w1", True)


@pytest.mark.parametrize(
    ("mounts", "expected"),
    [
        ({"/srv/testbed": "/srv/ws/w1/sub"}, {"srv"}),     # under a read-only host entry
        ({"/usr/share/x": "/srv/ws/w1/sub"}, {"usr"}),     # a system directory too
        ({"/logs": "/srv/ws/w1/logs"}, set()),             # a new top-level: the root's
        ({"/srv": "/srv/ws/w1/sub"}, set()),               # the entry itself: bound over
        ({"/home/a/b": "/srv/ws/w1/x", "/srv/t": "/srv/ws/w1/y"}, {"home", "srv"}),
    ],
)
def test_host_entries_holding_a_mount_point_are_overlays_of_their_own(
        mounts: dict[str, str], expected: set[str]) -> None:
    made = spec(layers=L, mounts=mounts)
    assert layout.mount_entries(made) == expected
    found = overlays(layout.plan_view(made))
    for name in expected:  # the host's directory as it is: its ids, not the workspace's
        assert found[f"{R}/{name}"] == [[[f"/{name}", False]], f"{L}/upper/top.{name}"]
    assert layout.mount_entries(spec(mounts=mounts)) == frozenset()  # no layers: no overlay


def test_prebuilt_system_dirs_are_bound_ahead_and_not_again() -> None:
    """A blank keeper binds the host's system directories read-only ahead of its claim
    (none through an id map); the claim binds the other entries, and a system directory
    that holds a mount point gets its overlay over the bind made ahead."""
    ahead = layout.prebuild_steps(L, ENTRIES)
    merged = f"{L}/merged"
    assert ahead[:3] == [["private"], ["mkdir", merged, 0o755],
                         ["overlay", [[f"{L}/empty", False]], f"{L}/upper/root",
                          f"{L}/work/root", merged]]
    assert [s for s in ahead if s[0] == "rbind_ro"] == [
        ["rbind_ro", f"/{n}", f"{merged}/{n}"] for n in ("etc", "usr", "var")]
    claim = layout.plan_view(spec(root=merged, layers=L, prebuilt=True,
                                  mounts={"/usr/share/x": "/srv/ws/w1/sub"}))
    bound = binds(claim)
    assert f"{merged}/etc" not in bound and f"{merged}/var" not in bound
    assert bound[f"{merged}/home"] == ("/home", False)
    assert overlays(claim)[f"{merged}/usr"] == [[["/usr", False]], f"{L}/upper/top.usr"]


def test_an_images_home_is_its_own_and_its_sys_the_hosts_read_only() -> None:
    """An image workspace's HOME is the image's directory in its `/` (its dotfiles, as
    `docker exec` shows them), not a directory of the workspace's state bound over it;
    its /sys is the host's, read-only, as a container runtime gives."""
    plan = layout.plan_view(spec(layers=L, image="/images/rootfs/abc", entries=ENTRIES,
                                 hidden_dirs=(), hidden_files=(), home_view="/root",
                                 home_in_root=True))
    shown = binds(plan)
    assert f"{R}/root" not in shown
    assert shown[f"{R}/sys"] == ("/sys", False)
    with_bind = binds(layout.plan_view(spec(layers=L, image="/images/rootfs/abc",
                                            entries=ENTRIES, home_view="/root")))
    assert with_bind[f"{R}/root"] == ("/state/workspaces/w1/home", True)


def test_a_writable_root_under_var_tmp_gets_its_mount_point_in_the_workspaces_own() -> None:
    """The view's /var/tmp is the workspace's own directory: a writable root the host has
    under /var/tmp is bound on a mount point made there (the host's /var, read-only, takes
    none)."""
    plan = layout.plan_view(spec(layers=L, writable=("/var/tmp/shared",)))
    bind = next(s for s in plan if s[0] == "idbind" and s[2] == f"{R}/var/tmp/shared")
    assert ["mkdir", f"{R}/var/tmp/shared", 0o755] in plan[:plan.index(bind)]
