"""What every `blueque` command shares: exit codes, refusals, output, the connection, argument
types, and ``Commands``, through which each command module adds its subcommands."""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn
from urllib.parse import urlsplit

import redis

from blueque.acl import Role
from blueque.client import Client
from blueque.config import default_url
from blueque.display import parse_duration, parse_eta
from blueque.errors import ConfigurationError, RedisUnavailable
from blueque.eviction import ALLOW_VARIABLE
from blueque.fields import typed
from blueque.queue import check_queue_name
from blueque.statuses import finish_time

EXIT_OK = 0
EXIT_FAILURE = 1  # the operation failed or was refused (e.g. a task failed, cannot cancel)
EXIT_USAGE = 2  # bad arguments, bad URL, bad configuration
EXIT_UNREACHABLE = 3  # Redis could not be reached
EXIT_NOT_FOUND = 4  # no such task or queue
#: The reader of our output went away (`blueque tasks q | head`): 128 + SIGPIPE, what a shell
#: reports for `seq 1 100000 | head`, whose seq the signal ends. Not 1, which Python's own
#: EPIPE exit would give: 1 says a task failed or an operation was refused.
EXIT_CLOSED_PIPE = 128 + signal.SIGPIPE

EXIT_CODES = f"""exit codes:
  {EXIT_OK}  success
  {EXIT_FAILURE}  failure: an operation was refused, a task failed, a wait timed out
  {EXIT_USAGE}  usage: bad arguments, bad Redis URL or credentials, Redis older than 6.2,
     a task function that cannot be imported, bad cron entry, a port in use,
     parameters over the queue's max_parameters_bytes
  {EXIT_UNREACHABLE}  Redis unreachable
  {EXIT_NOT_FOUND}  task or queue not found
  {EXIT_CLOSED_PIPE}  the output's reader went away (| head): ended quietly, as other tools"""


class Failure(Exception):
    """A command's refusal: its message goes to stderr and its code is the exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.code = code


def task_json(task_id: str, data: dict[str, str]) -> dict[str, Any]:
    """One task as `tasks`, `show` and `wait` print it with --json: its fields typed
    (blueque.fields.typed), and a finished task's ``finished_at`` too, its ``updated`` since
    issue 29 (PROTOCOL.md 3: no longer a field of its own), where a reader of the JSON always
    found it."""
    return {"id": task_id, **typed(with_finish_time(data))}


def with_finish_time(data: dict[str, str]) -> dict[str, str]:
    """``data`` with a finished task's ``finished_at`` (statuses.finish_time) when it has
    none."""
    ended = finish_time(data)
    if ended is None or "finished_at" in data:
        return data
    return {**data, "finished_at": ended}


def emit(args: argparse.Namespace, data: object, text: str) -> None:
    """Print ``data`` as JSON with --json, else ``text``. Hash fields in ``data`` are typed
    already (blueque.fields.typed)."""
    print(json_text(data) if args.json else text)


def json_text(data: object, indent: int | None = 2) -> str:
    """Strict JSON: a float that is not finite (no JSON number can say it) is null. The
    data is walked for such floats only when there is one (a fleet's status is 1,000
    listeners' fields)."""
    try:
        return json.dumps(data, indent=indent, allow_nan=False)
    except ValueError:  # a nan or an infinity somewhere
        return json.dumps(_finite(data), indent=indent, allow_nan=False)


def _finite(data: object) -> object:
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {key: _finite(value) for key, value in data.items()}
    if isinstance(data, (list, tuple)):
        return [_finite(value) for value in data]
    return data


def unknown_queue(queue: str, known: Sequence[str] = ()) -> Failure:
    """Exit 4 for a queue Redis does not know, with the closest known name (a typo)."""
    close = difflib.get_close_matches(queue, list(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return Failure(f"queue {queue!r} is not known (not in blueque_queues){hint}",
                   EXIT_NOT_FOUND)


def known_queue(client: Client, queue: str) -> str:
    """``queue``, if Redis knows it; else exit 4 (a typo must not read as an empty queue)."""
    names = client.queue_names()
    if queue not in names:
        raise unknown_queue(queue, names)
    return queue


#: Seconds the CLI's first contact waits for a server that accepted its connection to answer
#: (a Redis answers a PING in milliseconds; a port that is not Redis may never answer: it
#: took the 5 s of the connect timeout and then said "unreachable").
FIRST_CONTACT = 2.0


def connect(args: argparse.Namespace, ping: bool = True) -> Client:
    """A client for --url (else $BLUEQUE_URL, else redis://localhost:6379/0), checked with a
    PING so that an unreachable Redis is reported at once (exit 3). Daemons skip the PING:
    they retry with backoff until Redis is there (a listener started before its Redis)."""
    url = default_url() if args.url is None else args.url  # --url '' is a mistake, not "default"
    kwargs: dict[str, Any] = {}
    direct = urlsplit(url).scheme.lower() in ("redis", "rediss", "unix")
    if direct:
        kwargs["socket_connect_timeout"] = 5.0
    client = Client(url, **kwargs)
    if ping:
        try:
            first_contact(url, kwargs) if direct else client.ping()
        except BaseException:
            client.close()
            raise
    return client


def first_contact(url: str, kwargs: dict[str, Any]) -> None:
    """PING (and the server check) on a connection of its own that waits FIRST_CONTACT
    seconds for an answer (the command's own connections may wait on a reply for long:
    ``wait``, ``status --watch``): a server that accepts and never answers is no Redis."""
    probe = Client(url, socket_timeout=FIRST_CONTACT, **kwargs)  # the URL's own wins
    try:
        probe.ping()
    except RedisUnavailable as error:
        cause = error.__cause__
        if isinstance(cause, redis.exceptions.TimeoutError) and "reading" in str(cause):
            raise RedisUnavailable(
                f"the server at {probe.store.where} accepted the connection but did not "
                f"answer within {FIRST_CONTACT:g} s: it is not a Redis, or a Redis too busy "
                "to answer; check the URL's host and port") from error
        raise
    finally:
        probe.close()


# --- argument types ---------------------------------------------------------------------------
def argument_type(parse: Callable[[str], object]) -> Callable[[str], object]:
    """An argparse type whose message is the parser's own (argparse hides a ValueError's)."""

    def convert(text: str) -> object:
        try:
            return parse(text)
        except ConfigurationError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = parse.__name__
    return convert


duration = argument_type(parse_duration)
eta_time = argument_type(parse_eta)
queue_name = argument_type(check_queue_name)


def positive_duration(text: str) -> float:
    """A duration above 0 (90, 15m, 2h)."""
    try:
        value = parse_duration(text)
    except ConfigurationError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {text!r}")
    return value


# --- the parser -------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """argparse's parser, with a suggestion for a misspelt choice (`blueque lisen`: did you
    mean 'listen'?), and (parse_command) the command's own usage for an unknown option."""

    def error(self, message: str) -> NoReturn:
        invalid = re.match(r"argument .*: invalid choice: '([^']*)' \(choose from (.*)\)$",
                           message)
        if invalid:
            choices = re.findall(r"'([^']*)'", invalid[2])
            close = difflib.get_close_matches(invalid[1], choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        super().error(message)

    def _print_message(self, message: str, file: Any = None) -> None:
        # argparse's own ignores every OSError of the write: --help and --version to a closed
        # pipe exited 0 having printed nothing; main makes a closed pipe EXIT_CLOSED_PIPE
        if message:
            (file or sys.stderr).write(message)

    def parse_command(self, argv: Sequence[str] | None) -> argparse.Namespace:
        """parse_args, but an argument nobody knows is refused with the command's usage."""
        parsed, extra = self.parse_known_args(argv)
        if extra:
            parser = getattr(parsed, "parser", self)
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed


# --- commands ---------------------------------------------------------------------------------
#: A subcommand's handler: the client (connected per the command's kind) and the arguments.
Handler = Callable[[Client, argparse.Namespace], int]
#: A subcommand that makes its own connection, if any (`blueque demo` may start its Redis).
Standalone = Callable[[argparse.Namespace], int]


@dataclass(frozen=True)
class Run:
    """How main runs a parsed subcommand."""

    handler: Handler | None = None
    standalone: Standalone | None = None
    #: A daemon waits for Redis with backoff instead of exiting 3 when it is not up yet.
    daemon: bool = False
    #: It prints something --json can shape (a table, a record); else --json is refused.
    prints: bool = True
    #: What its Redis user must be allowed (blueque.acl), checked before it writes anything
    #: (a daemon checks it itself once Redis answers)
    role: Role | None = None


URL_HELP = "Redis URL (default: $BLUEQUE_URL, else redis://localhost:6379/0)"


def add_common(parser: argparse.ArgumentParser, top: bool, url_help: str = URL_HELP,
               json_option: bool = True) -> None:
    # the subcommand's copy must not overwrite a value given before the subcommand
    absent: Any = None if top else argparse.SUPPRESS
    parser.add_argument("--url", default=absent, help=url_help)
    if json_option:
        parser.add_argument("--json", action="store_true", default=False if top else absent,
                            help="print JSON for scripts instead of tables")


def add_allowed_host(parser: argparse.ArgumentParser, what: str,
                     flag: str = "--allowed-host") -> None:
    """The names an HTTP server of ours answers to besides its own (blueque.hosts)."""
    parser.add_argument(flag, action="append", default=[], metavar="NAME",
                        help=f"a host name the {what} may be reached as (a reverse proxy's, "
                             "passing the Host header on); repeatable. On 127.0.0.1 it answers "
                             "to localhost, 127.0.0.1 and ::1 only, so that no web page can "
                             "read it by pointing its own name here (DNS rebinding)")


def add_allow_eviction(parser: argparse.ArgumentParser, role: str) -> None:
    """--allow-eviction, of `listen`, `scheduler` and `dashboard` (blueque.eviction)."""
    parser.add_argument(
        "--allow-eviction", action="store_true", default=None,
        help=f"start the {role} even if Redis' maxmemory-policy lets it delete keys when it "
             "is full (anything but noeviction: tasks would be lost without a word); logged "
             f"as a warning. Also ${ALLOW_VARIABLE}=1")


def check_json(args: argparse.Namespace) -> None:
    """``blueque --json listen ...``: --json before a command that prints nothing it could
    shape is a mistake to say, not to ignore (daemons log JSON with --log-format json)."""
    if args.json and not args.run.prints:
        raise Failure(f"--json: blueque {args.command} prints no table or record to shape "
                      "(a daemon logs JSON with --log-format json)", EXIT_USAGE)


class Commands:
    """The `blueque` subcommands: each command module's ``register(commands)`` adds its own,
    each with its handler beside its arguments."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self._subparsers = parser.add_subparsers(dest="command", metavar="COMMAND",
                                                 required=True)

    def add(self, name: str, handler: Handler, help_text: str, role: Role, *,
            daemon: bool = False, prints: bool = True) -> argparse.ArgumentParser:
        """A command run with a client: PINGed first (exit 3 at once if Redis is not
        there), except a daemon's, and its user's permissions for ``role`` checked.
        ``prints`` False: no --json (it prints nothing to shape)."""
        return self._add(name, Run(handler=handler, daemon=daemon, prints=prints, role=role),
                         help_text)

    def add_standalone(self, name: str, handler: Standalone, help_text: str, *,
                       url_help: str = URL_HELP) -> argparse.ArgumentParser:
        return self._add(name, Run(standalone=handler, prints=False), help_text, url_help)

    def _add(self, name: str, run: Run, help_text: str, url_help: str = URL_HELP
             ) -> argparse.ArgumentParser:
        sub = self._subparsers.add_parser(
            name, help=help_text, description=help_text, epilog=EXIT_CODES,
            formatter_class=argparse.RawDescriptionHelpFormatter)
        add_common(sub, top=False, url_help=url_help, json_option=run.prints)
        sub.set_defaults(run=run, parser=sub)
        return sub
