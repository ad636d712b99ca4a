"""The task function behind examples/fastapi_service.py: build a report page by page.

    PYTHONPATH=examples blueque listen reports report_tasks:build_report

Parameters (JSON): ``title``, ``pages`` (how many) and ``seconds_per_page`` (the simulated
work). It reports its progress after every page, which the service streams to browsers, and
fails on a title containing "fail", the way a real job fails on bad input.
"""

from __future__ import annotations

import json
import time

from blueque import report_progress
from blueque.task import Task


def build_report(task: Task) -> dict[str, object]:
    parameters = json.loads(task.parameters or "{}")
    title, pages = str(parameters["title"]), int(parameters["pages"])
    if "fail" in title.lower():
        raise ValueError(f"cannot build a report titled {title!r}")
    for page in range(1, pages + 1):
        time.sleep(float(parameters.get("seconds_per_page", 0.1)))
        report_progress(page / pages, f"page {page} of {pages}")
    return {"title": title, "pages": pages, "words": pages * 350}
