"""The check a role makes before it writes anything (blueque.acl): may this Redis user run
every command the role runs, on its keys and channels? One pipeline of ACL DRYRUN, where Redis
can answer it."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import redis

from blueque import acl
from blueque.errors import PermissionRefused
from blueque.store.errors import translate

if TYPE_CHECKING:
    from blueque.store.core import StoreCore

log = logging.getLogger("blueque.store")

#: How many refusals the message names (the ACL line that fixes them all follows).
NAMED = 4


def user_of(store: StoreCore) -> str:
    """The user the store's connections authenticate as ("default" without one)."""
    pool = getattr(store.redis, "connection_pool", None)
    return str(getattr(pool, "connection_kwargs", {}).get("username") or "default")


def check_permissions(store: StoreCore, role: acl.Role, queues: Iterable[str]) -> bool:
    """Raise PermissionRefused (a ConfigurationError: exit 2) naming what the user may not
    run of ``role``'s commands, keys and channels; True once checked, False where Redis could
    not say (no ACL DRYRUN before Redis 7, a user not allowed acl|dryrun itself, a Cluster:
    each node has its own users), said at info: a missing permission then shows at its first
    use, as PermissionRefused too."""
    if hasattr(store.redis, "get_nodes"):
        log.info("Redis ACL permissions of %s not checked up front: a Cluster's nodes each "
                 "have their own users", role)
        return False
    user, tried = user_of(store), acl.probes(role, queues, store.keys)
    pipe = store.redis.pipeline(transaction=False)
    for probe in tried:
        pipe.execute_command("ACL", "DRYRUN", user, *probe)
    try:
        answers = pipe.execute(raise_on_error=False)
    except redis.exceptions.RedisError as error:
        raise translate(error, store.where) from error
    failed = [a for a in answers if isinstance(a, Exception)]
    if failed and len(failed) == len(answers):  # ACL DRYRUN itself: unknown, or refused
        log.info("Redis user %r: its ACL permissions for the %s role not checked up front "
                 "(ACL DRYRUN: %s); a missing one shows at its first use", user, role,
                 failed[0])
        return False
    denied = [(probe, str(answer)) for probe, answer in zip(tried, answers, strict=True)
              if isinstance(answer, str) and answer != "OK"]
    slower = [acl.missing(probe, answer) for probe, answer in denied if acl.optional(role, probe)]
    refused = [acl.missing(probe, answer) for probe, answer in denied
               if not acl.optional(role, probe)]
    if slower:
        log.warning("Redis user %r at %s may not run %s: the %s works without, more slowly "
                    "(it polls its queues every --poll seconds instead of hearing enqueues); "
                    "its role's ACL line: %s", user, store.where, "; ".join(slower), role,
                    acl.acl_line(role, user))
    if refused:
        more = f" and {len(refused) - NAMED} more" if len(refused) > NAMED else ""
        raise PermissionRefused(
            f"Redis user {user!r} at {store.where} may not run what the {role} role needs "
            f"({acl.DESCRIBED[role]}): {'; '.join(refused[:NAMED])}{more}; nothing was "
            f"written. Give it the role's permissions (docs/how-to/acl.md): "
            f"{acl.acl_line(role, user)}")
    return True
