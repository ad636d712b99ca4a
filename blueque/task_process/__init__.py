"""The task process (PROTOCOL.md 6.2, 6.7, 6.8), in parts: the forked process that runs one
task (``child``), the warm one that runs several in turn (``warm``), the fork server they are
forked from (``forkserver``, ``python -m blueque.task_process.forkserver``, and its frames:
``server_frames``), the task function it calls (``calling``), its progress (``progress``)
and its output's capture (``capture``). The listener daemon imports it; it imports nothing
of the daemon."""
