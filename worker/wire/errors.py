"""The one error base of the worker side: a machine-readable kind and a message.

A kind travels in results (`SystemError_.kind`) and in control replies, and the client
turns each into a typed exception (`bashfleet.client.errors`). The engine's, the jobs' and the
signing's errors are this class under names that say where they come from.
"""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal[
    "bad_cwd", "spawn_failed", "blocked", "invalid", "worker_lost", "unavailable",
    "not_found", "internal", "unauthorized", "limit",
]
"""Every kind of failure the fleet reports (the tool's failure, never the command's)."""

FileProblem = Literal["missing", "directory", "not_directory", "denied", "special",
                      "timed_out"]
"""What was wrong with the file itself when a workspace's file operation failed (the
client raises FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError;
for `special`, a FIFO, a device or a socket where a regular file was meant, and
`timed_out`, a file that did not let itself be read or written within the operation's
deadline, a WorkspaceFileError and a TimeoutError)."""


class ToolError(Exception):
    """A failure of the tool, with its `kind` and a `message` for a person or a model."""

    def __init__(self, kind: ErrorKind, message: str, file: FileProblem | None = None) -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind
        self.message = message
        self.file = file
