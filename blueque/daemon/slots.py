"""A listener's slots (``--concurrency``): its children, and the runs of dead listeners of its
node that it answers for, each holding one until its process ends (PROTOCOL.md 6 step 3).
Slots count; the loop sweeps (recovery) and gives them what the sweep found ours."""

from __future__ import annotations

from dataclasses import dataclass, field

from blueque.process import process_alive
from blueque.recovery import RecoveryReport


@dataclass
class Slots:
    total: int
    #: live runs of dead listeners of this node that we adopted: task id -> (pid, created)
    adopted: dict[str, tuple[int, float | None]] = field(default_factory=dict)
    #: live runs of dead listeners of this node in our care but not on our slots: their
    #: queue is not ours and no listener of it on the node counts them yet (RecoveryReport)
    carried: dict[str, tuple[int, float | None]] = field(default_factory=dict)
    #: fenced runs of dead listeners of this node that our sweep is stopping: pid -> created
    fenced: dict[int, float | None] = field(default_factory=dict)

    def take(self, report: RecoveryReport) -> bool:
        """The runs a sweep found ours; True if the adopted ones changed."""
        changed = set(report.adopted_runs) != set(self.adopted)
        self.adopted = dict(report.adopted_runs)
        self.carried = dict(report.carried_runs)
        self.fenced = dict(report.fenced_runs)
        return changed

    def in_care(self) -> dict[str, tuple[int, float | None]]:
        """The runs of dead listeners we answer for (adopted and carried): our stop waits for
        them or stops them, our node's preemption tells and stops them."""
        return {**self.carried, **self.adopted}

    def adopted_pids(self) -> list[int]:
        return [pid for pid, _ in self.in_care().values()]

    def busy(self, children: int) -> int:
        return children + len(self.adopted) + len(self.fenced)

    def free(self, children: int) -> int:
        """Slots free now: an adopted or fenced run frees its slot when its process ends
        (no need to wait for the next sweep)."""
        self.adopted = {t: run for t, run in self.adopted.items() if process_alive(*run)}
        self.carried = {t: run for t, run in self.carried.items() if process_alive(*run)}
        self.fenced = {pid: created for pid, created in self.fenced.items()
                       if process_alive(pid, created)}
        return self.total - self.busy(children)
