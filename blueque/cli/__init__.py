"""The ``blueque`` command: the listener daemon, the scheduler, and operator tools.

Each subcommand is a short function over library calls, with its arguments beside it in the
module of its group: ``inspecting`` (status, whose code is ``status``'s; tasks, show, logs),
``changing`` (enqueue, cancel, preempt, retry, purge, configure, forget-queue, pause, resume),
``wait``, ``listen`` and ``daemons`` (scheduler, metrics, dashboard, demo). Readable tables for
people; ``--json`` for scripts. Exit codes: see EXIT_CODES (also in ``blueque --help`` and
docs/reference/exit-codes.md).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import os
import sys
from collections.abc import Sequence

from blueque.cli import changing, daemons, fleet, inspecting, listen, wait
from blueque.cli.base import (
    EXIT_CLOSED_PIPE,
    EXIT_CODES,
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    Commands,
    Failure,
    Parser,
    Run,
    add_common,
    check_json,
    connect,
)
from blueque.errors import (
    BluequeError,
    ConfigurationError,
    RedisUnavailable,
    TaskNotFound,
    TooLarge,
)

__all__ = ["EXIT_CLOSED_PIPE", "EXIT_CODES", "EXIT_FAILURE", "EXIT_NOT_FOUND", "EXIT_OK",
           "EXIT_UNREACHABLE", "EXIT_USAGE", "Failure", "build_parser", "main"]

#: The command modules, in the order `blueque --help` lists their commands.
GROUPS = (inspecting, changing, fleet, wait, listen, daemons)


def build_parser() -> Parser:
    parser = Parser(
        prog="blueque", description="Blueque: a Redis job queue for very long jobs.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(parser, top=True)
    parser.add_argument("--version", action="version", version=f"blueque {_version()}")
    commands = Commands(parser)
    for group in GROUPS:
        group.register(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("blueque")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: run from a source checkout)"


def main(argv: Sequence[str] | None = None) -> int:
    """Run one `blueque` command; its exit code. A closed pipe (`blueque tasks q | head`)
    ends it quietly with EXIT_CLOSED_PIPE, whichever write finds it: one while the command
    prints, or the flush of what is still buffered when it is done."""
    try:
        code = _main(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        return _closed_pipe()
    return code


def _closed_pipe() -> int:
    """Python flushes stdout once more at exit, which would raise again (and print "Exception
    ignored"): stdout's descriptor is pointed at /dev/null first, as the Python docs' note on
    SIGPIPE does. In-process (a test's captured stdout) there is no descriptor to point."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass
    finally:
        os.close(devnull)
    return EXIT_CLOSED_PIPE


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_command(argv)
    except SystemExit as exit_:  # --help (0) or a usage error (2, already explained)
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    try:
        return _run(args.run, args)
    except Failure as failure:
        return _fail(str(failure), failure.code)
    except ConfigurationError as error:
        return _fail(str(error), EXIT_USAGE)
    except RedisUnavailable as error:
        return _fail(str(error), EXIT_UNREACHABLE)
    except TaskNotFound as error:
        return _fail(str(error), EXIT_NOT_FOUND)
    except TooLarge as error:  # bad input: nothing was written
        return _fail(str(error), EXIT_USAGE)
    except (BluequeError, TimeoutError) as error:
        return _fail(str(error), EXIT_FAILURE)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_FAILURE)


def _run(run: Run, args: argparse.Namespace) -> int:
    check_json(args)
    if run.standalone is not None:
        return run.standalone(args)
    assert run.handler is not None
    client = connect(args, ping=not run.daemon)
    try:
        if not run.daemon and run.role is not None:  # before it writes anything (blueque.acl)
            client.store.check_server(run.role, [q for q in [getattr(args, "queue", None)] if q])
        return int(run.handler(client, args))
    finally:
        client.close()


def _fail(message: str, code: int) -> int:
    print(f"blueque: error: {message}", file=sys.stderr)
    return code
