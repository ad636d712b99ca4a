"""The task function of the document pipeline: analyse one page (run by ``blueque listen``).

    PYTHONPATH=examples blueque listen document-pages document_tasks:process_page --concurrency 4

Parameters (JSON): ``doc_id``, ``page`` and ``text``. The work is simulated: it takes longer
for longer pages (up to about half a second) and fails on pages that are unreadable scans, the
way OCR jobs fail on blank or corrupt images. The result (JSON) is what Spark aggregates.
"""

from __future__ import annotations

import json
import time
import zlib
from collections import Counter

from blueque.task import Task

#: Pages starting with this have no text layer: processing them fails.
UNREADABLE = "[unreadable scan]"
#: Seconds of simulated work per word, and the cap.
SECONDS_PER_WORD = 0.001
MAX_SECONDS = 0.5


def process_page(task: Task) -> dict[str, object]:
    parameters = json.loads(task.parameters or "{}")
    text = str(parameters["text"])
    started = time.monotonic()
    words = text.split()
    # variable duration: proportional to the page, with a deterministic jitter per page
    jitter = zlib.crc32(f"{parameters['doc_id']}/{parameters['page']}".encode()) % 50 / 1000
    time.sleep(min(MAX_SECONDS, len(words) * SECONDS_PER_WORD) + jitter)
    if text.startswith(UNREADABLE):
        raise ValueError(f"page {parameters['page']} of {parameters['doc_id']} has no text layer")
    counts = Counter(word.lower().strip(".,;") for word in words)
    return {
        "words": len(words),
        "characters": len(text),
        "distinct_words": len(counts),
        "top_word": min(counts, key=lambda w: (-counts[w], w)) if counts else None,
        "seconds": round(time.monotonic() - started, 4),
    }


def summarize_document(task: Task) -> dict[str, object]:
    """A document's statistics, from its pages' tasks: enqueued ``after=`` every page of the
    document with ``after_any`` (it runs once they have all ended, however), it reads them
    with ``task.parents()``: which failed, and the words and characters of the others."""
    pages = [(json.loads(p.parameters or "{}"), p) for p in task.parents()]
    done = [json.loads(p.result or "{}") for _, p in pages if p.status == "complete"]
    failed = sorted(int(params["page"]) for params, p in pages if p.status != "complete")
    return {
        "doc_id": json.loads(task.parameters or "{}")["doc_id"],
        "pages": len(pages),
        "pages_failed": len(failed),
        "failed_pages": failed,
        "words": sum(int(r.get("words", 0)) for r in done),
        "characters": sum(int(r.get("characters", 0)) for r in done),
    }
