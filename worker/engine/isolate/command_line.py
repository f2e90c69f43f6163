"""bash's command line for a command: `bash -c COMMAND` when the command fits in one
argument, else bash reads it from a descriptor.

Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN: 32 pages, its NUL included); an
execve with a longer one fails with E2BIG ("Argument list too long"), yet a call's
command may be 1 MiB (an agent writes a 150 KB file with one heredoc). Such a command
goes into an anonymous file (memfd) that bash inherits, and a short `-c` program reads
it with bash's own `read` (no external tool, which an image may lack; the exact bytes,
trailing newlines kept) and runs it with `eval`, which parses and runs it one command
at a time as `-c` does. The program passes bash's argv[0] again, so `$0` and `$#` are
those of `bash -c COMMAND`; BASH_ENV is sourced before it as before; its variable is
unset before the command's first line runs and the descriptor closed, so the command
inherits neither. What differs: the process list shows the program, and bash's own
error messages say `eval:` where they said `-c:`. A command that fits keeps
`bash -c COMMAND` exactly.

Measured: reading and running a 1,000,000-byte heredoc so takes ~25 ms more than a
`bash -c` of the same size would (one memfd, one write; bash reads it in 4 KiB blocks).

Standard library only: the job supervisor runs it as `python -I -S`.
"""

from __future__ import annotations

import os

#: The largest command (bytes, as execve gets it) passed as bash's `-c` argument: one
#: less than MAX_ARG_STRLEN for its NUL.
ARGUMENT_MAX = 128 * 1024 - 1
#: Where a command run in a workspace finds its descriptor: beside the state (200) and
#: cgroup (201) descriptors, above those scripts (3-9) and bash (10 and up) use.
COMMAND_FD = 202
_VARIABLE = "BASHFLEET_COMMAND"


def fits(command: str) -> bool:
    """Whether `command` can be bash's `-c` argument."""
    return len(os.fsencode(command)) <= ARGUMENT_MAX


def reader(fd: int) -> str:
    """The `-c` program that reads the command from descriptor `fd` and runs it."""
    return (f"IFS= read -r -d '' -u {fd} {_VARIABLE}; exec {fd}<&-; "
            f'eval "unset {_VARIABLE};${_VARIABLE}"')


def read_from_descriptor(program: str) -> bool:
    """Whether a `-c` program is `reader`'s (what a process list shows for a long
    command)."""
    fd = program.partition(" -u ")[2].partition(" ")[0]
    return fd.isdigit() and program == reader(int(fd))


class CommandLine:
    """bash's argv for a command, and the descriptor to pass when it is read from one.

    `fd` (close-on-exec, None when the command fits) must reach bash as `fd_in_child`;
    close the object once bash started.
    """

    def __init__(self, shell: list[str], command: str, *, fd_in_child: int | None = None) -> None:
        """`shell`: bash and its options (`["bash", "-l"]`); `fd_in_child`: the number
        the descriptor gets in bash (None: the same number)."""
        self.fd: int | None = None
        self.fd_in_child: int | None = None
        if fits(command):
            self.argv = [*shell, "-c", command]
            return
        self.fd = os.memfd_create("bashfleet-command", os.MFD_CLOEXEC)
        try:
            data = os.fsencode(command)
            written = 0
            while written < len(data):
                written += os.pwrite(self.fd, data[written:], written)
        except OSError:
            self.close()
            raise
        self.fd_in_child = self.fd if fd_in_child is None else fd_in_child
        # The second argument after -c becomes $0: bash's argv[0], as with `-c COMMAND`.
        self.argv = [*shell, "-c", reader(self.fd_in_child), shell[0]]

    def close(self) -> None:
        """Drop the descriptor (bash holds its own copy once it started)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
