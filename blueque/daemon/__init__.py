"""The listener daemon (``blueque listen``), in parts: its life (``loop.ListenerDaemon``:
signals, stop, leaving), which has one step over its parts (``step.ListenerStep``: what to run
and when), its options (``options.ListenerOptions``), its presence in Redis (``membership``),
its children (``supervisor``) and their endings (``recorder``), its slots (``slots``), what
wakes it (``wakeup``) and the guard of exclusive runs (``exclusive``). Nothing outside this
package but the surfaces (the CLI, ForkingRunner) imports it."""

from blueque.daemon.loop import ListenerDaemon
from blueque.daemon.options import ListenerOptions

__all__ = ["ListenerDaemon", "ListenerOptions"]
