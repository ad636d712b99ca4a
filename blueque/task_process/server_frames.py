"""The frames between a listener and its fork server (PROTOCOL.md 6.8), one JSON object a
packet of their SOCK_SEQPACKET control socket, typed as the listener-child frames are
(blueque.reporting): a TypedDict for each, ``ToForkServer`` and ``FromForkServer``."""

from __future__ import annotations

from typing import TypedDict, final


# --- listener -> fork server ------------------------------------------------------------------
class ForkOrder(TypedDict):
    """A task process to make: its assignment (``task`` "" for a spare, made before its task),
    and how many tasks it may run (``reuse``, 6.7). The descriptors come with the packet: its
    socket, then its output pipe's two ends if the listener reads its output."""

    task: str
    queue: str
    listener: str
    patience: float
    node: str
    reuse: int
    spare: bool


@final
class ForkRequest(TypedDict):
    fork: ForkOrder


@final
class ReapRequest(TypedDict):
    """The exits the listener settled: the server reaps their zombies (pids may be reused)."""

    reap: list[int]


#: What a listener sends its fork server.
ToForkServer = ForkRequest | ReapRequest


# --- fork server -> listener ------------------------------------------------------------------
@final
class ReadyAnswer(TypedDict):
    """Set up and its task module imported: it takes requests (its pid)."""

    ready: int


@final
class FailedAnswer(TypedDict):
    """It could not start (why); it exits, and the listener forks its task processes itself."""

    failed: str


@final
class ForkedAnswer(TypedDict):
    """A request's process made: its pid and create time."""

    forked: int
    created: float | None


@final
class RefusedAnswer(TypedDict):
    """A request not met (why: unreadable, a fork that failed)."""

    refused: str


@final
class ExitedAnswer(TypedDict):
    """A child of its exited (its raw wait status), left a zombie until the listener reaps."""

    exited: int
    status: int


@final
class LoadedAnswer(TypedDict):
    """A task process used Redis: the server has loaded the client since (the spares made
    before would import it themselves, and are retired)."""

    loaded: bool


#: What a fork server sends its listener.
FromForkServer = (ReadyAnswer | FailedAnswer | ForkedAnswer | RefusedAnswer | ExitedAnswer
                  | LoadedAnswer)
