"""The import path task modules and the README used before the task process had its own wing
(issue 34): ``from blueque.child import report_progress, preempted, ...`` keeps working. The
code is blueque.task_process.child's; new code imports these names from ``blueque``."""

from blueque.task_process.child import (
    Preempted,
    TaskFunction,
    on_preempt,
    preempt_deadline,
    preempted,
    report_progress,
)

__all__ = ["Preempted", "TaskFunction", "on_preempt", "preempt_deadline", "preempted",
           "report_progress"]
