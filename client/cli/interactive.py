"""`run --tty`, `run` with stdin piped in, `attach` and `write`: interactive
processes from a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from bashfleet.client import exit_status as statuses
from bashfleet.client.cli import common, results
from bashfleet.client.exit_status import USAGE as EXIT_USAGE
from bashfleet.worker.wire.control import SessionOutput

if TYPE_CHECKING:
    pass


# ------------------------------------------------------ interactive: tty, stdin, attach


def _session_status(out: SessionOutput | None) -> int:
    """The exit status of `run --tty` / piped `run` / `attach` for the job's last output."""
    if out is None:
        return 0  # detached: it runs on
    return statuses.of_process(out.exit_code, out.signal)


def run_interactive(args: argparse.Namespace, *, tty: bool) -> int:
    """`run --tty` (a PTY job, this terminal attached) or `run` with piped stdin (a pipe
    job, stdin forwarded, output streamed): the command's exit status."""
    from bashfleet.client import attach  # noqa: PLC0415

    if args.json or args.follow or args.mode != "default":
        print("bashfleet run: --tty and piped stdin take no --json, --follow or --mode "
              "(pass --no-stdin to run without forwarding stdin)", file=sys.stderr)
        return EXIT_USAGE
    fleet = common.open_fleet()
    from bashfleet.client.attach import window_size  # noqa: PLC0415

    found = window_size(0) if tty else None
    size = {"rows": found[0], "cols": found[1]} if found else None
    result = fleet.run(
        " ".join(args.command), host=args.host, mode="background", cwd=args.cwd,
        session=args.session, isolation=args.isolation, network=args.network,
        tags=common.tag_filter(args.tag), stdin="pty" if tty else "pipe", term_size=size,
        workspace=args.workspace,
        check=False,
    )
    if result.job is None:
        results.print_result(result)
        return statuses.of_call(result)
    try:
        if tty:
            last = attach.attach(fleet, result.job.id)
        else:
            last = attach.forward_stdin(fleet, result.job.id)
    except KeyboardInterrupt:
        print(f"\n[job {result.job.id} keeps running: `bashfleet attach {result.job.id}`, "
              f"`bashfleet kill {result.job.id}`]", file=sys.stderr)
        return statuses.INTERRUPTED
    return _session_status(last)


def cmd_attach(args: argparse.Namespace) -> int:
    from bashfleet.client import attach  # noqa: PLC0415

    key = attach.parse_detach_key(args.detach_key)  # ValueError: a usage error
    last = attach.attach(common.open_fleet(), args.id, detach_key=key,
                         header=f"[attached to job {args.id}; {attach.key_name(key)} detaches]")
    if last is not None:
        print(f"\r\n[job {args.id} ended: {_ending_text(last)}]", file=sys.stderr)
    return _session_status(last)


def _ending_text(out: SessionOutput) -> str:
    if out.signal is not None:
        return f"killed by signal {out.signal}"
    return f"exit code {out.exit_code}" if out.exit_code is not None else "exit status unknown"


def cmd_write(args: argparse.Namespace) -> int:
    from bashfleet.worker.wire.control import Collect  # noqa: PLC0415

    collect = Collect(wait_s=args.wait, settle_s=0.3, input_wait_s=2.0)
    fleet = common.open_fleet()
    if args.close and not args.text:
        # Only the end of input: no line was given, so none is sent before it.
        out = fleet.close_stdin(args.id, collect=collect)
    else:
        text = " ".join(args.text) + ("" if args.no_newline else "\n")
        out = fleet.write_stdin(args.id, text, collect=collect)
        if args.close:
            out = fleet.close_stdin(args.id, collect=collect)
    if args.json:
        print(out.model_dump_json(indent=2))
        return 0
    if out.output:
        sys.stdout.write(out.output if out.output.endswith("\n") else out.output + "\n")
    state = "running" if out.running else _ending_text(out)
    if out.input_wait is not None:
        state += f"; waiting for input after printing {json.dumps(out.input_wait.prompt)}"
    print(f"[job {out.id} on {out.host}: {state}]", file=sys.stderr)
    return 0
