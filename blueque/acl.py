"""What a Redis ACL user must be allowed for each Blueque role (docs/how-to/acl.md,
PROTOCOL.md 1, "Permissions"), and the checks a command makes before it writes anything.

A role's commands are its connection's (HELLO, PING, INFO, TIME...), those it sends itself,
and every command of the scripts it runs (read from the scripts: a Lua script's commands are
checked one by one as it runs them, so a refusal half-way would leave its first writes done).
Its keys are ``blueque_*`` (read-only for the inspector) and its channels ``blueque_*``.

The check (``RedisStore.check_server(role, queues)``) asks Redis ``ACL DRYRUN [user]
[command] [args]`` for each command of the role, on a real key and channel of its first
queue, in one pipeline; the first refusals are raised as ``PermissionRefused`` (exit 2),
naming the command, key or channel. Where Redis cannot answer it (before Redis 7, no ACL
DRYRUN; a user not allowed ``acl|dryrun`` itself) the check is skipped, and a missing
permission shows at its first use, as ``PermissionRefused`` too; the submit scripts publish
before they write, so that an enqueue refused its channel writes nothing.
"""

from __future__ import annotations

import functools
import importlib.resources
import re
from collections.abc import Iterable
from typing import Literal

from blueque import keys as k

Role = Literal["client", "listener", "scheduler", "inspector", "operator"]
ROLES: tuple[Role, ...] = ("client", "listener", "scheduler", "inspector", "operator")

#: What each role is, for the docs' table and the refusal's message.
DESCRIBED: dict[Role, str] = {
    "client": "a service that enqueues tasks and waits for them (blueque enqueue, "
              "Queue.enqueue, Task.wait)",
    "listener": "blueque listen",
    "scheduler": "blueque scheduler",
    "inspector": "read-only: blueque status, tasks, show, logs, wait, metrics, and a read-only "
                 "dashboard",
    "operator": "blueque cancel, retry, purge, configure, forget-queue, preempt, pause, "
                "resume, and the dashboard's actions",
}

#: Every connection's: its handshake, the server check, the server clock. (redis-py's CLIENT
#: SETINFO, of Redis 7.2, is not needed: redis-py goes on when it is refused.)
CONNECTION = ("hello", "ping", "select", "info", "time", "client|setname")
SCRIPTING = ("evalsha", "eval", "script|load")
#: Waiting for a task (its done channel) and hearing enqueues and cancels.
LISTENING = ("subscribe", "unsubscribe")
#: What a role does without, more slowly: a listener refused SUBSCRIBE polls its queues every
#: --poll seconds instead of hearing enqueues (its subscriber says so and backs off), so the
#: check warns of it rather than refusing to start a listener that works.
WITHOUT: dict[Role, frozenset[str]] = {"listener": frozenset(LISTENING)}
#: (Not CONFIG GET: the memory policy is read from INFO where CONFIG is refused, as managed
#: services do; a user that has it saves that second look.)
READS = ("exists", "type", "get", "hget", "hmget", "hgetall", "hlen", "hexists",
         "llen", "lrange", "lindex", "lpos", "scard", "smembers", "sscan", "sismember", "zcard",
         "zrange", "zrevrange", "zrangebyscore", "zscore", "zcount", "zrank", "xrange",
         "xrevrange", "strlen")
#: Commands sent outside scripts by the roles that change tasks.
WRITES = ("set", "del", "expire", "pexpire", "hset", "hdel", "hincrby", "lpush", "lrem",
          "lmove", "blmove", "sadd", "srem", "zadd", "zincrby", "zrem", "zremrangebyscore",
          "xadd", "xdel", "publish", "multi", "exec", "wait")
#: The scripts a client runs (enqueue, enqueue_many, after=; settle tells a new dependent).
CLIENT_SCRIPTS = ("submit", "submit_many", "submit_after", "tell")


@functools.cache
def script_commands(names: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The commands the scripts ``names`` call (None: every script), their libraries'
    included, from their source."""
    folder = importlib.resources.files("blueque").joinpath("lua")
    files = [f for f in folder.iterdir() if f.name.endswith(".lua")] + \
        [f for f in folder.joinpath("lib").iterdir() if f.name.endswith(".lua")]
    wanted = [f for f in files if names is None or f.name[:-4] in names
              or f.name[:-4] in _libraries(names, folder)]
    found = {m.lower() for f in wanted
             for m in re.findall(r"redis\.p?call\(\s*['\"](\w+)['\"]", f.read_text("utf-8"))}
    return tuple(sorted(found))


def _libraries(names: tuple[str, ...] | None, folder: object) -> set[str]:
    used: set[str] = set()
    for name in names or ():
        source = folder.joinpath(f"{name}.lua").read_text("utf-8")  # type: ignore[attr-defined]
        for line in source.splitlines():
            if line.startswith("-- uses:"):
                used.update(part.strip() for part in line.removeprefix("-- uses:").split(","))
    return used


def commands(role: Role) -> tuple[str, ...]:
    """Every command ``role`` may send (subcommands as ``script|load``), sorted."""
    if role == "inspector":
        found = {*CONNECTION, *READS, *LISTENING}
    elif role == "client":
        found = {*CONNECTION, *SCRIPTING, *LISTENING, "exists", "type", "hget", "hmget",
                 "hgetall", "sadd", "smembers", "zadd", "publish", "wait",
                 *script_commands(CLIENT_SCRIPTS)}
    else:  # listener, scheduler, operator: they run every script
        found = {*CONNECTION, *SCRIPTING, *LISTENING, *READS, *WRITES, *script_commands()}
    return tuple(sorted(found))


def acl_line(role: Role, user: str | None = None) -> str:
    """The ``ACL SETUSER`` line of a user for ``role`` (its password left to the reader):
    keys ``blueque_*`` (read-only for the inspector), channels ``blueque_*``, its commands,
    and ``acl|dryrun``, which lets Blueque check the rest up front."""
    keys = "%R~blueque_*" if role == "inspector" else "~blueque_*"
    allowed = " ".join(f"+{command}" for command in (*commands(role), "acl|dryrun"))
    return (f"ACL SETUSER {user or 'blueque-' + role} on >PASSWORD resetkeys {keys} "
            f"resetchannels &blueque_* -@all {allowed}")


#: The arguments of one ACL DRYRUN probe per command: K a key, C a channel (of the role's
#: first queue); others are placeholders of the right number (DRYRUN checks arity).
_PROBES: dict[str, tuple[str, ...]] = {
    "hello": ("3",), "ping": (), "select": ("0",), "info": ("server",), "time": (),
    "client|setname": ("blueque",),
    "evalsha": ("0" * 40, "1", "K"), "eval": ("return 1", "1", "K"),
    "script|load": ("return 1",), "subscribe": ("C",), "unsubscribe": ("C",),
    "publish": ("C", "x"), "config|get": ("maxmemory-policy",), "exists": ("K",),
    "type": ("K",), "get": ("K",), "set": ("K", "1"), "del": ("K",), "hget": ("K", "f"),
    "hmget": ("K", "f"), "hgetall": ("K",), "hlen": ("K",), "hexists": ("K", "f"),
    "hset": ("K", "f", "v"), "hdel": ("K", "f"), "hincrby": ("K", "f", "1"), "llen": ("K",),
    "lrange": ("K", "0", "-1"), "lindex": ("K", "0"), "lpos": ("K", "x"),
    "lpush": ("K", "x"), "rpush": ("K", "x"), "lrem": ("K", "0", "x"), "lset": ("K", "0", "x"),
    "lmove": ("K", "K", "RIGHT", "LEFT"), "blmove": ("K", "K", "RIGHT", "LEFT", "1"),
    "scard": ("K",), "smembers": ("K",), "sscan": ("K", "0"), "sismember": ("K", "x"),
    "sadd": ("K", "x"),
    "srem": ("K", "x"), "zcard": ("K",), "zrange": ("K", "0", "-1"),
    "zrevrange": ("K", "0", "-1"), "zrangebyscore": ("K", "0", "1"), "zscore": ("K", "x"),
    "zcount": ("K", "0", "1"), "zrank": ("K", "x"), "zadd": ("K", "0", "x"),
    "zincrby": ("K", "0", "x"), "zrem": ("K", "x"), "zremrangebyscore": ("K", "0", "1"),
    "xrange": ("K", "-", "+"), "xrevrange": ("K", "+", "-"), "xadd": ("K", "*", "f", "v"),
    "xdel": ("K", "0-1"), "xlen": ("K",), "strlen": ("K",), "expire": ("K", "1"),
    "pexpire": ("K", "1"), "persist": ("K",),
    "multi": (), "exec": (), "wait": ("0", "0"),
}


def probes(role: Role, queues: Iterable[str], keys: k.Keys | None = None
           ) -> list[tuple[str, ...]]:
    """The ACL DRYRUN argument lists of ``role`` (each command, on its first queue's
    pending list and channel)."""
    keys = keys or k.Keys()
    queue = next(iter(queues), "blueque-check")
    key, channel = keys.pending(queue), keys.channel(queue)
    found = []
    for command in commands(role):
        arguments = tuple(key if a == "K" else channel if a == "C" else a
                          for a in _PROBES[command])
        found.append((*command.split("|"), *arguments))
    return found


def optional(role: Role, probe: tuple[str, ...]) -> bool:
    """Whether ``role`` works, more slowly, without the command of ``probe`` (WITHOUT)."""
    return _command_of(probe) in WITHOUT.get(role, frozenset())


def missing(probe: tuple[str, ...], answer: str) -> str:
    """What a refused probe lacks, in words: the command, key or channel Redis named."""
    command = " ".join(probe[:2]) if "|" in _command_of(probe) else probe[0]
    return f"{command.upper()} ({answer.rstrip('.')})"


def _command_of(probe: tuple[str, ...]) -> str:
    joined = "|".join(probe[:2])
    return joined if joined in _PROBES else probe[0]
