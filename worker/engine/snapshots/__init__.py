"""Snapshots: a workspace's own layers frozen read-only, that new workspaces stand on
(`snapshots`); their layers between hosts through the fleet's OCI registry
(`snapshot_registry`); copying a workspace's tree without following a path its commands
can change (`tree_copy`); and the extent-sharing file system for hosts whose own cannot
(`layer_fs`).
"""
