"""Which node a process runs on: the only place where a pid means something.

A pid is only meaningful inside one PID namespace of one running kernel. Host names are not
enough to tell such places apart: `socket.getfqdn()` is `localhost` on many machines,
containers and cloned VMs. A node identity is therefore the node name (the host name, or the
operator's ``--node-name``) followed by a short hash of the kernel's boot id and the PID
namespace: ``[node name]:[12 hex digits]``. Two processes may judge each other's pids only
when their node identities are equal (PROTOCOL.md, "Node identity").
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass
from functools import lru_cache

import psutil

from blueque.errors import ConfigurationError
from blueque.policy import field_float

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
PID_NAMESPACE_PATH = "/proc/self/ns/pid"


@lru_cache(maxsize=1)
def hostname() -> str:
    """The fully qualified host name, as blueque 1.0.1 uses in listener ids."""
    return socket.getfqdn()


def checked_node_name(value: str) -> str:
    """A ``--node-name``: non-empty, no whitespace or control characters (the started set
    joins listener ids with spaces)."""
    if not value or any(c.isspace() or not c.isprintable() for c in value):
        raise ConfigurationError(
            f"node name {value!r} must be non-empty, without whitespace or control characters")
    return value


def boot_id() -> str:
    """The running kernel's boot id (new at every boot, so cloned VMs differ); where the
    kernel has none (not Linux), the boot time."""
    try:
        with open(BOOT_ID_PATH, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return f"boot-time:{psutil.boot_time():.0f}"


def pid_namespace() -> str:
    """This process's PID namespace, e.g. ``pid:[4026531836]`` ("" where there are none)."""
    try:
        return os.readlink(PID_NAMESPACE_PATH)
    except OSError:
        return ""


def node_identity(name: str | None = None) -> str:
    """``[node name]:[hash of boot id and PID namespace]``; equal only for processes that
    see the same pids. Computed afresh each time: a forked process may sit in another
    namespace than the module's importer."""
    digest = hashlib.sha256(f"{boot_id()}\n{pid_namespace()}".encode()).hexdigest()[:12]
    return f"{name or hostname()}:{digest}"


def parse_listener_id(value: str) -> tuple[str, int | None]:
    """``[node name]_[pid]`` -> (node name, pid); pid None if the id has no numeric tail."""
    host, _, pid = value.rpartition("_")
    return (host, int(pid)) if pid.isdigit() else (value, None)


def local_process(listener: str, info: dict[str, str], node: str, host: str
                  ) -> tuple[int, float | None] | None:
    """The pid and create time of ``listener`` if it runs on this node, else None (then
    only its lease can tell whether it lives).

    ``info`` is its ``blueque_listener_[id]`` hash. With a ``node`` field, the node identity
    decides, exactly. Without one (blueque 1.0.1 writes no info; an earlier Blueque wrote no
    node), 1.0.1's own rule applies: the host name part of the id equals ``host``."""
    created = field_float(info.get("pid_created"))
    if "node" in info:
        if info["node"] != node:
            return None
        raw = info.get("pid", "")
        pid = int(raw) if raw.isdigit() else parse_listener_id(listener)[1]
        return None if pid is None else (pid, created)
    name, pid = parse_listener_id(listener)
    if name != host or pid is None:
        return None
    return pid, created




@dataclass(frozen=True)
class NodeListener:
    """A listener daemon as its node knows it: its entry in blueque_listeners_on_[node
    identity] (PROTOCOL.md §2), its process (pid and create time, so a reused pid is not
    taken for it) and the queues it serves. A sweep reads its node's entries in one command
    and judges each by its process: no read of any other node's listener."""

    id: str
    pid: int
    created: float | None
    queues: tuple[str, ...]

    def entry(self) -> str:
        """Its value in the node's hash (JSON)."""
        return json.dumps({"pid": self.pid, "created": self.created,
                           "queues": list(self.queues)})

    def serves(self, queue: str) -> bool:
        return queue in self.queues

    def with_queue(self, queue: str) -> NodeListener:
        """The entry with ``queue`` among its queues too."""
        return self if queue in self.queues else NodeListener(
            self.id, self.pid, self.created, (*self.queues, queue))

    @classmethod
    def of(cls, listener: str, raw: str) -> NodeListener | None:
        """The entry as written (None if it cannot be read: an entry that tells nothing)."""
        try:
            entry = json.loads(raw)
            pid, queues = entry["pid"], entry["queues"]
            created = entry.get("created")
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if (not isinstance(pid, int) or not isinstance(queues, list)
                or not all(isinstance(q, str) for q in queues)):
            return None
        return cls(listener, pid, float(created) if isinstance(created, int | float) else None,
                   tuple(queues))

    @classmethod
    def all_of(cls, entries: dict[str, str]) -> dict[str, NodeListener]:
        """Every readable entry of a node's hash, by listener id."""
        found = (cls.of(listener, raw) for listener, raw in entries.items())
        return {entry.id: entry for entry in found if entry is not None}

