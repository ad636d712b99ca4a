"""What Redis holds of a task's output, as ``blueque logs`` (``--follow`` too, from any
machine) and the dashboard read it (PROTOCOL.md 5.19): the tails of its ended attempts, one
string of the task's (``blueque_output_[id]``), and the stream of a running attempt
(``blueque_task_log_[id]``; a stream written before issue 29 also holds ended attempts, each
closed by an end mark). blueque.tasklog writes both.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from blueque.store import RedisStore


def parse_tails(raw: str | None) -> dict[str, tuple[int | None, str]]:
    """The task's output tails as blueque_output_[id] holds them (PROTOCOL.md 5.19): attempt
    -> (offset after its text in its file, text). A value that is not what end_output.lua
    writes reads as no tails, and an entry that is not one as none: a display never fails
    on it."""
    try:
        tails = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(tails, dict):
        return {}
    parsed: dict[str, tuple[int | None, str]] = {}
    for attempt, tail in tails.items():
        if isinstance(tail, list) and len(tail) == 2 and isinstance(tail[1], str):
            parsed[str(attempt)] = (tail[0] if isinstance(tail[0], int) else None, tail[1])
    return parsed


@dataclass
class Output:
    """One attempt's output as Redis holds it (its last TAIL_BYTES): from the task's output
    tails once it ended, from its stream while it runs (or from an older stream)."""

    attempt: str
    text: str
    last_id: str  # the newest stream entry read, for following on ("-": none)
    ended: bool  # the attempt is over: its tail was read, or an older stream's end mark
    #: where the last stream entry read ends in the attempt's file (None: no entry read)
    offset: int | None = None
    #: the length of the output tails when read (a follower reads them again when it changes)
    tails_size: int = 0
    #: set by follow_output when a later attempt began before this one ended
    superseded_by: str | None = None


def read_outputs(store: RedisStore, task_id: str) -> tuple[dict[str, Output], str | None]:
    """Every attempt's output Redis holds, by attempt number (the tails and the stream, one
    pipeline), and the newest attempt: the highest number (None when there is none)."""
    raw, entries = store.outputs(task_id)
    parts: dict[str, list[str]] = {}
    ended: set[str] = set()
    offsets: dict[str, int | None] = {}
    for _, fields in entries:
        attempt = fields.get("attempt", "0")
        parts.setdefault(attempt, []).append(fields.get("data", ""))
        offsets[attempt] = _whole_number(fields.get("offset"))
        if fields.get("end") == "1":
            ended.add(attempt)
    last_id = entries[-1][0] if entries else "-"
    size = len(raw.encode("utf-8")) if raw else 0
    outputs = {attempt: Output(attempt, "".join(texts), last_id, attempt in ended,
                               offsets.get(attempt), size)
               for attempt, texts in parts.items()}
    for attempt, (_, text) in parse_tails(raw).items():  # ended: what the stream had moved
        outputs[attempt] = Output(attempt, text, last_id, True, None, size)
    if not outputs:
        return {}, None
    ordered = dict(sorted(outputs.items(), key=lambda item: _number(item[0])))
    return ordered, max(ordered, key=_number)


def read_output(store: RedisStore, task_id: str, attempt: int | None = None) -> Output | None:
    """The output of ``attempt`` (default: the newest attempt Redis holds), or None when
    Redis holds nothing of it."""
    outputs, newest = read_outputs(store, task_id)
    return outputs.get(str(attempt) if attempt is not None else newest or "")


def wait_for_output(store: RedisStore, task_id: str, attempt: int | None,
                    finished: Callable[[], bool], poll: float = 0.2) -> Output | None:
    """For ``--follow`` on a task whose attempt has not written yet (pending, scheduled, just
    started): wait until it does, or until the task is finished (or gone) with nothing."""
    while True:
        output = read_output(store, task_id, attempt)
        if output is not None:
            return output
        if finished():
            return read_output(store, task_id, attempt)  # what came just before the end
        time.sleep(poll)


def follow_output(store: RedisStore, task_id: str, output: Output,
                  finished: Callable[[], bool], poll: float = 0.2, quiet: float = 2.0
                  ) -> Iterator[str]:
    """What the attempt writes after ``output``, as it comes, until it ended (its tail is in
    the task's output tails: what it holds past what was printed comes last; or an older
    stream's end mark); or, for a run that died without either, until a later attempt begins
    (``output.superseded_by``) or the task is finished and nothing came for ``quiet``
    seconds. Reads Redis only, so it works from any machine."""
    heard = time.monotonic()
    while not output.ended:
        entries, size = store.outputs_since(task_id, output.last_id)
        texts = _take(output, entries)
        if texts is not None:
            heard = time.monotonic()
            yield from texts
        if size != output.tails_size and not output.ended:
            output.tails_size = size
            tail = parse_tails(store.output_tails(task_id)).get(output.attempt)
            if tail is not None:
                output.ended = True
                rest = _unprinted(tail, output.offset)
                if rest:
                    yield rest
        if output.ended or output.superseded_by is not None:
            return
        if time.monotonic() - heard > quiet and finished():
            return
        time.sleep(poll)


def _take(output: Output, entries: list[tuple[str, dict[str, str]]]) -> list[str] | None:
    """The texts of ``output``'s attempt among stream entries read after it (None when none
    of them is its), ``output`` moved past them: its last entry and offset, its end mark, a
    later attempt's beginning."""
    texts: list[str] | None = None
    for entry, fields in entries:
        output.last_id = entry
        attempt = fields.get("attempt", "0")
        if attempt != output.attempt:
            if _number(attempt) > _number(output.attempt):
                output.superseded_by = attempt  # this run is over: it will say no more
            continue
        if texts is None:
            texts = []
        if fields.get("data"):
            texts.append(fields["data"])
        output.offset = _whole_number(fields.get("offset"))
        output.ended = output.ended or fields.get("end") == "1"
    return texts


def _unprinted(tail: tuple[int | None, str], printed: int | None) -> str:
    """What an ended attempt's tail holds past ``printed`` (the offset in its file of the
    last entry a follower printed): all of it when the two do not line up (nothing printed,
    more missed than the tail keeps, or the file cut at its cap in between)."""
    end, text = tail
    if printed is None or end is None:
        return text
    data = text.encode("utf-8")
    unprinted = end - printed
    if 0 <= unprinted <= len(data):
        return data[len(data) - unprinted:].decode("utf-8", "replace")
    return text


def _whole_number(raw: str | None) -> int | None:
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def _number(attempt: str) -> int:
    try:
        return int(attempt)
    except ValueError:
        return -1
