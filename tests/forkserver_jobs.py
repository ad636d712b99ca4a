"""A task module that imports nothing of Blueque's (PROTOCOL.md 6.8): what its task process
holds is what its fork server held when it forked it."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any


def where(task: Any) -> str:
    """Prints its "say" when given; appends "[task id] [pid] [parent pid]" to its "marker"
    file and writes the modules it finds loaded (redis, blueque's) to "modules" when given,
    and how its process came by libc's prctl to "lookups"; waits for its "release" file when
    given, then appends "[task id] [threads]" to its "threads" file when given; reads its
    parents from Redis when "parents" is given; returns its "value"."""
    params = json.loads(task.parameters or "{}")
    if "say" in params:
        print(params["say"], flush=True)
    with open(params["marker"], "a", encoding="utf-8") as handle:
        handle.write(f"{task.id} {os.getpid()} {os.getppid()}\n")
    if "modules" in params:
        loaded = sorted(m for m in sys.modules if m.startswith(("redis", "blueque")))
        with open(params["modules"], "w", encoding="utf-8") as handle:
            json.dump(loaded, handle)
    if "lookups" in params:  # how its process came by libc's prctl (loaded already: no import)
        cache = sys.modules["blueque.run_processes"].libc_prctl.cache_info()
        with open(params["lookups"], "w", encoding="utf-8") as handle:
            json.dump({"hits": cache.hits, "misses": cache.misses}, handle)
    while "release" in params and not os.path.exists(params["release"]):
        time.sleep(0.02)
    if "threads" in params:  # a process that took its output pipe over has a reader thread
        with open(params["threads"], "a", encoding="utf-8") as handle:
            handle.write(f"{task.id} {threading.active_count()}\n")
    if params.get("parents"):
        task.parents()
    return str(params.get("value", "done"))
