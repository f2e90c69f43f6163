"""The workspaces of this host: made, found, used, reaped.

A workspace is a directory on this host plus the namespaces its calls share (its keeper:
`bashfleet.worker.engine.isolate.keeper`). Its calls' kept output and its jobs' output go to
`<workspace root>/.out/<id>`, read-only in its view at the same path. One module a job:

- `store`: records and paths;
- `making`: a new workspace, its directory, layers, mounts and keeper;
- `blank_pool`: keepers made ahead of need;
- `visibility`: what its processes see, and as whom;
- `keeper_calls`: a process started through its keeper;
- `usage`: its processes and disk;
- `lifecycle`: delete, restore, network changes, reaping leases;
- `held_groups`: the old cgroups a restore found still held, until they empty;
- `throwaway_pool`: the workspaces of calls that name none.

This package's own names are what the rest of the worker uses.
"""

from __future__ import annotations

from bashfleet.worker.engine.workspaces.blank_pool import make_blank, reap_blanks
from bashfleet.worker.engine.workspaces.disk import remove_tree
from bashfleet.worker.engine.workspaces.held_groups import remove_emptied as remove_held_groups
from bashfleet.worker.engine.workspaces.keeper_calls import WorkspaceProcess, connections, start
from bashfleet.worker.engine.workspaces.lifecycle import (
    delete,
    finish_endings,
    reap,
    restore,
    set_network,
)
from bashfleet.worker.engine.workspaces.making import (
    create,
    group_of,
    make_ahead,
    project_dir,
)
from bashfleet.worker.engine.workspaces.store import (
    LEASE_GRACE_S,
    LEASE_LOOK_S,
    WorkspaceError,
    last_used,
    load,
    local_records,
    new_id,
    record_path,
    save,
    state_path,
    touch,
)
from bashfleet.worker.engine.workspaces.throwaway_pool import throwaways, warm
from bashfleet.worker.engine.workspaces.usage import (
    check_disk,
    disk_bytes,
    disk_cap_notice,
    over_disk_cap,
    processes,
    view,
)
from bashfleet.worker.engine.workspaces.visibility import home_of, shell_of, workspace_env

__all__ = [
    "LEASE_GRACE_S",
    "LEASE_LOOK_S",
    "WorkspaceError",
    "WorkspaceProcess",
    "check_disk",
    "connections",
    "create",
    "delete",
    "disk_bytes",
    "disk_cap_notice",
    "finish_endings",
    "group_of",
    "home_of",
    "last_used",
    "load",
    "local_records",
    "make_ahead",
    "make_blank",
    "new_id",
    "over_disk_cap",
    "processes",
    "project_dir",
    "reap",
    "reap_blanks",
    "record_path",
    "remove_held_groups",
    "remove_tree",
    "restore",
    "save",
    "set_network",
    "shell_of",
    "start",
    "state_path",
    "throwaways",
    "touch",
    "view",
    "warm",
    "workspace_env",
]
