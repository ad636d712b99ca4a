"""The Redis page: what the server says of itself (INFO), read at each refresh and shown as
people read it: version and uptime, memory and its eviction policy (blueque.eviction),
persistence (AOF, RDB snapshots and how the last ones went), clients, replication."""

from __future__ import annotations

from typing import Any

from blueque.eviction import MemoryPolicy
from blueque.store import RedisStore


def _int(raw: object) -> int | None:
    try:
        return int(str(raw))
    except ValueError:
        return None


def replicas(info: dict[str, Any]) -> list[dict[str, str]]:
    """The replicas a master lists (``slave0``...: ip, port, state, offset, lag)."""
    found = []
    for n in range(_int(info.get("connected_slaves")) or 0):
        entry = info.get(f"slave{n}")
        if isinstance(entry, dict):
            found.append({name: str(entry.get(name, "")) for name in
                          ("ip", "port", "state", "offset", "lag")})
    return found


def persistence(info: dict[str, Any]) -> dict[str, Any]:
    aof = str(info.get("aof_enabled", "0")) == "1"
    saves = _int(info.get("rdb_saves")) or 0
    last_save = _int(info.get("rdb_last_save_time"))
    return {
        "aof": aof,
        "aof_status": str(info.get("aof_last_write_status", "")),
        "aof_rewrite_status": str(info.get("aof_last_bgrewrite_status", "")),
        "rdb_changes": _int(info.get("rdb_changes_since_last_save")),
        "rdb_last_save": last_save,
        "rdb_status": str(info.get("rdb_last_bgsave_status", "")),
        "rdb_in_progress": str(info.get("rdb_bgsave_in_progress", "0")) == "1",
        "rdb_saves": saves,
        "loading": str(info.get("loading", "0")) == "1",
        # INFO does not say whether `save` rules are set: the config does (CONFIG GET save)
    }


def server(where: str, info: dict[str, Any], save_rules: str | None) -> dict[str, Any]:
    """One server's panel; ``save_rules`` is its ``save`` setting (None: not readable)."""
    maxmemory = _int(info.get("maxmemory"))
    policy = MemoryPolicy(where, str(info.get("maxmemory_policy") or "") or None, maxmemory,
                          "INFO memory")
    stored = persistence(info)
    stored["save_rules"] = save_rules
    stored["none"] = (not stored["aof"] and save_rules is not None and not save_rules.strip())
    return {
        "where": where,
        "version": str(info.get("redis_version", "?")),
        "mode": str(info.get("redis_mode", "")),
        "uptime": _int(info.get("uptime_in_seconds")),
        "memory": {
            "used": _int(info.get("used_memory")),
            "peak": _int(info.get("used_memory_peak")),
            "rss": _int(info.get("used_memory_rss")),
            "maxmemory": maxmemory,
            "policy": policy,
        },
        "persistence": stored,
        "clients": {
            "connected": _int(info.get("connected_clients")),
            "blocked": _int(info.get("blocked_clients")),
            "max": _int(info.get("maxclients")),
            "rejected": _int(info.get("rejected_connections")),
        },
        "replication": {
            "role": str(info.get("role", "?")),
            "replicas": replicas(info),
            "master": (f"{info.get('master_host')}:{info.get('master_port')}"
                       if info.get("master_host") else ""),
            "link": str(info.get("master_link_status", "")),
        },
    }


def redis_page(store: RedisStore) -> dict[str, Any]:
    """INFO of the server (each master of a cluster), and its ``save`` rules when CONFIG GET
    is allowed: pipelines of two commands per server."""
    rules = store.save_rules()
    return {"servers": [server(where, info, rules.get(where))
                        for where, info in store.server_infos()]}
