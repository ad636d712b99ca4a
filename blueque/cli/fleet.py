"""Fleet controls: `limit` (concurrency limits per key across the fleet, PROTOCOL.md 5.22)."""

from __future__ import annotations

import argparse
from typing import Any

from blueque.cli.base import EXIT_OK, EXIT_USAGE, Commands, Failure, emit
from blueque.client import Client
from blueque.display import table
from blueque.keyed import KeyState


def register(commands: Commands) -> None:
    sub = commands.add(
        "limit", cmd_limit,
        "at most N runs at once of the tasks enqueued with concurrency_key=KEY, across every "
        "listener; without N: show each key's limit, holders and waiters", role="operator")
    sub.add_argument("key", nargs="?", metavar="KEY", help="the concurrency key (all: none)")
    sub.add_argument("limit", nargs="?", type=_limit, metavar="N",
                     help="a whole number, 0 or more (0: no run of the key starts)")
    sub.add_argument("--clear", action="store_true", help="remove KEY's limit (no limit)")


def _limit(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number, 0 or more, not {text!r}")
    return int(text)


def cmd_limit(client: Client, args: argparse.Namespace) -> int:
    if args.clear and (args.key is None or args.limit is not None):
        raise Failure("--clear goes with a KEY and no N: blueque limit KEY --clear", EXIT_USAGE)
    if args.limit is not None or args.clear:
        holding = client.set_limit(args.key, None if args.clear else args.limit)
        what = "no limit" if args.clear else f"limit {args.limit}"
        emit(args, {"key": args.key, "limit": None if args.clear else args.limit,
                    "holding": holding},
             f"key {args.key}: {what}; {holding} run(s) hold a slot")
        return EXIT_OK
    states = client.key_states(None if args.key is None else [args.key])
    emit(args, [_state_json(state) for state in states], _states_text(states))
    return EXIT_OK


def _state_json(state: KeyState) -> dict[str, Any]:
    return {"key": state.key, "limit": state.limit, "holding": state.holding,
            "waiting": state.waiting,
            "holders": [{"task": h.task_id, "listener": h.listener, "queue": h.queue,
                         "attempt": h.attempt} for h in state.holders],
            "waiters": list(state.waiters)}


def _states_text(states: list[KeyState]) -> str:
    if not states:
        return "no concurrency key has a limit or a run"
    rows = [[state.key, "none" if state.limit is None else str(state.limit),
             str(state.holding), str(state.waiting),
             ", ".join(f"{h.task_id} on {h.listener}" for h in state.holders) or "-"]
            for state in states]
    return table(["KEY", "LIMIT", "HOLDING", "WAITING", "HELD BY"], rows)
