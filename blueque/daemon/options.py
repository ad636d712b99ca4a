"""A listener daemon's options: one frozen value, one table of defaults, checked once.

``blueque listen`` builds it from its arguments, ``ForkingRunner`` from 1.0.1's (one queue, a
callback), tests as they need; ``ListenerDaemon(client, options)`` gives each of its parts what
it needs of it when it makes them (huey's consumer options are the model)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from blueque.errors import ConfigurationError
from blueque.task_process.child import TaskFunction
from blueque.tasklog import TaskLogSettings

ON_STOP = ("keep", "drain", "terminate", "preempt")


@dataclass(frozen=True)
class ListenerOptions:
    """Everything a listener daemon is told. Raises ConfigurationError when made wrong."""

    #: the queues served and their weights ({"high": 3, "low": 1}: high drawn more often)
    queues: dict[str, int]
    #: called with the Task in a forked child ("package.module:function", imported at start)
    function: TaskFunction | str
    concurrency: int = 1  # tasks run at once, one child each
    on_stop: str = "keep"  # on SIGTERM: one of ON_STOP (keep is preempt as PID 1)
    interval: float = 10.0  # lease renewal and recovery sweep interval (s)
    poll: float = 1.0  # fallback poll for enqueues that publish nothing (s)
    identity: str | None = None  # its listener id (default [node name]_[pid])
    node_name: str | None = None  # default: the fully qualified host name
    #: start on a Redis that may evict keys (None: $BLUEQUE_ALLOW_EVICTION decides)
    allow_eviction: bool | None = None
    #: run() is called by a program that keeps its own SIGTERM and SIGINT handling
    #: (ForkingRunner.run(), see wakeup.ProgramSignals); else they stop the listener
    in_program: bool = False
    #: where endings Redis cannot take are held on this node (PROTOCOL.md 6.5; None:
    #: $XDG_STATE_HOME/blueque/spool)
    spool_dir: Path | None = None
    exclusive: bool = False  # every run is exclusive (PROTOCOL.md 6.6)
    #: tasks one task process may run in turn (PROTOCOL.md 6.7: warm processes; 1: one each)
    reuse: int = 1
    #: a warm process whose resident memory is over this many bytes once its task has ended
    #: retires (6.7; Celery's max_memory_per_child); None: no bound
    max_memory_per_process: int | None = None
    #: where task output goes on the node and how much is kept (None: the listener's stderr)
    task_logs: TaskLogSettings | None = None
    #: on SIGUSR1 (this node goes away; SIGTERM with on_stop "preempt"), how long its tasks
    #: have to save and stop (s)
    preempt_grace: float = 90.0
    #: keep Prometheus counters (ListenerDaemon.metrics) for a metrics server to serve
    metrics: bool = False
    #: what this listener offers its tasks' ``requires`` (``--resources gpu=2,memory=64G``,
    #: PROTOCOL.md 5.22): name -> amount; a task it runs or adopted uses what it requires
    resources: dict[str, float] = field(default_factory=dict)

    def uses_fork_server(self, settings: object | None) -> bool:
        """The one rule of PROTOCOL.md 6.8: task processes come from a fork server when the
        listener knows its task function by an import path (``package.module:function``) and
        its Redis by connection settings (a Client made from a URL or Settings, whose
        ``settings`` are given here); a Python callable, or a client made from a ready redis-py
        client, and the listener forks them from itself."""
        return isinstance(self.function, str) and settings is not None

    def __post_init__(self) -> None:
        object.__setattr__(self, "queues", dict(self.queues))  # a copy: never the caller's
        object.__setattr__(self, "resources", dict(self.resources))
        if not self.queues:
            raise ConfigurationError("a listener needs at least one queue")
        if self.concurrency < 1:
            raise ConfigurationError(f"concurrency must be at least 1, not {self.concurrency}")
        if self.reuse < 1:
            raise ConfigurationError(f"reuse must be at least 1, not {self.reuse}")
        if self.max_memory_per_process is not None and self.max_memory_per_process < 1:
            raise ConfigurationError(f"max_memory_per_process must be at least 1 byte, not "
                                     f"{self.max_memory_per_process}")
        if self.on_stop not in ON_STOP:
            raise ConfigurationError(f"--on-stop must be one of {ON_STOP}, not "
                                     f"{self.on_stop!r}")
        if not self.interval > 0 or not self.poll > 0:
            raise ConfigurationError(f"interval and poll must be more than 0 seconds, not "
                                     f"{self.interval!r} and {self.poll!r}")
        if not (self.preempt_grace >= 0 and math.isfinite(self.preempt_grace)):
            raise ConfigurationError(f"the preemption grace must be 0 seconds or more, not "
                                     f"{self.preempt_grace!r}")


def default(name: str) -> Any:
    """The default of one option: the one table the CLI's defaults come from too."""
    return {option.name: option.default for option in fields(ListenerOptions)}[name]
