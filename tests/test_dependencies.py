"""Task dependencies (``after=``, PROTOCOL.md 5.21) against a real redis-server: what a
waiting task is, when it is released, how a parent's failure or cancel ends it, the sweep
that repairs an ending nobody told, and the refusals that write nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

import blueque
from blueque import dependencies, flows, metrics
from blueque.errors import DependencyError
from blueque.recovery import Recovery
from tests.conftest import Run
from tests.dashboard import DashboardProcess
from tests.test_dashboard import get

Q = "deps"


def _finish(client: blueque.Client, task_id: str, outcome: str = "complete") -> None:
    """Run one pending task of any queue through 1.0.1's API and record its ending (the
    store's finish, as a listener's)."""
    queue = client.get_task(task_id).queue
    assert queue is not None
    listener = client.get_listener(queue)
    taken = listener.reserve()
    assert taken is not None and taken.id == task_id, f"{task_id} was not next"
    processor = client.get_processor(taken)
    if outcome == "complete":
        processor.complete(f"result of {task_id}")
    else:
        processor.fail(f"{task_id} broke")


def test_a_task_after_another_waits_then_is_released_when_it_completes(
        contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue(Q)
    parent = queue.enqueue("p")
    child = queue.enqueue("c", after=parent)
    assert contract_client.get_task(child).status == "waiting"
    assert contract_client.redis.lrange(f"blueque_pending_tasks_{Q}", 0, -1) == [parent]
    assert queue.stats().waiting == 1
    assert queue.task_ids("waiting") == [child]
    assert json.loads(contract_client.get_task(child).data["after"]) == [parent]
    assert contract_client.redis.smembers(f"blueque_dependents_{parent}") == {child}
    _finish(contract_client, parent)
    assert contract_client.get_task(child).status == "pending"
    assert contract_client.redis.lrange(f"blueque_pending_tasks_{Q}", 0, -1) == [child]
    assert queue.stats().waiting == 0
    assert not contract_client.redis.exists(f"blueque_awaits_{child}",
                                            f"blueque_dependents_{parent}")


def test_a_task_waits_for_every_parent_of_any_queue(contract_client: blueque.Client) -> None:
    pages = contract_client.get_queue("pages")
    first, second = pages.enqueue("1"), contract_client.get_queue("other").enqueue("2")
    assemble = contract_client.get_queue(Q).enqueue("book", after=[first, second, first])
    assert contract_client.get_task(assemble).after == [first, second]  # each parent once
    _finish(contract_client, first)
    assert contract_client.get_task(assemble).status == "waiting"
    assert contract_client.get_task(assemble).awaiting() == [second]
    _finish(contract_client, second)
    assembled = contract_client.get_task(assemble)
    assert assembled.status == "pending"
    parents = assembled.parents()
    assert [(p.id, p.status, p.result) for p in parents] == [
        (first, "complete", f"result of {first}"), (second, "complete", f"result of {second}")]


def test_a_failed_parent_fails_its_dependents_through_three_levels(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    queue = client.get_queue(Q)
    root = queue.enqueue("root")
    level1 = queue.enqueue("1", after=root)
    level2 = client.get_queue("second").enqueue("2", after=level1)
    level3 = queue.enqueue("3", after=[level2])
    _finish(client, root, "failed")
    for child, parent in ((level1, root), (level2, level1), (level3, level2)):
        task = client.get_task(child)
        assert task.status == "failed" and not task.cancelled
        assert task.error is not None and task.error.startswith(f"parent {parent} failed")
        assert task.history[-1]["was"] == "waiting"
    assert f"{root} broke" in (client.get_task(level3).error or "")
    assert redis_client.lrange("blueque_failed_tasks_second", 0, -1) == [level2]
    assert client.get_queue(Q).stats().waiting == 0
    assert client.get_queue(Q).stats().failed == 3
    assert redis_client.hget(f"blueque_outcome_counts_{Q}", "failed") == "3"


def test_cancelling_a_waiting_task_cancels_it_and_fails_its_dependents(
        contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue(Q)
    root = queue.enqueue("root")
    middle = queue.enqueue("m", after=root)
    leaf = queue.enqueue("l", after=middle)
    assert contract_client.cancel_task(middle, "not needed") == "cancelled"
    cancelled = contract_client.get_task(middle)
    assert cancelled.state == "cancelled" and cancelled.error == "cancelled: not needed"
    assert contract_client.redis.lrange(f"blueque_cancelled_tasks_{Q}", 0, -1) == [middle]
    assert contract_client.get_task(leaf).error == (
        f"parent {middle} was cancelled: cancelled: not needed")
    _finish(contract_client, root)  # the root still runs; its cancelled dependent stays cancelled
    assert contract_client.get_task(middle).state == "cancelled"
    with pytest.raises(blueque.InvalidTaskState):
        contract_client.cancel_task(middle)


def test_cancelling_a_pending_parent_ends_its_dependents(client: blueque.Client) -> None:
    queue = client.get_queue(Q)
    root = queue.enqueue("root")
    child = queue.enqueue("c", after=root)
    assert client.cancel_task(root) == "cancelled"
    assert client.get_task(child).status == "failed"
    assert client.get_task(child).error == f"parent {root} was cancelled: cancelled: cancelled"


def test_after_any_runs_after_a_parent_that_failed(contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue(Q)
    good, bad = queue.enqueue("g"), queue.enqueue("b")
    cleanup = queue.enqueue("cleanup", after=[good, bad], after_any=True)
    _finish(contract_client, good)
    _finish(contract_client, bad, "failed")
    task = contract_client.get_task(cleanup)
    assert task.status == "pending"
    assert [p.status for p in task.parents()] == ["complete", "failed"]


def test_a_task_after_parents_that_already_ended_is_decided_at_once(
        client: blueque.Client) -> None:
    queue = client.get_queue(Q)
    done, broken = queue.enqueue("d"), queue.enqueue("b")
    _finish(client, done)
    _finish(client, broken, "failed")
    assert client.get_task(queue.enqueue("x", after=done)).status == "pending"
    late = client.get_task(queue.enqueue("y", after=[done, broken]))
    assert late.status == "failed" and late.error == f"parent {broken} failed: {broken} broke"


def test_a_released_task_with_an_eta_is_scheduled(contract_client: blueque.Client) -> None:
    queue = contract_client.get_queue(Q)
    parent = queue.enqueue("p")
    later = queue.schedule("l", delay=3600, after=parent)
    past = queue.schedule("s", eta=contract_client.store.now() - 10, after=parent)  # due at once
    assert contract_client.get_task(later).status == "waiting"
    _finish(contract_client, parent)
    assert contract_client.get_task(later).status == "scheduled"
    eta = contract_client.get_task(later).eta
    assert contract_client.redis.zscore(f"blueque_scheduled_tasks_{Q}", later) == eta
    assert contract_client.get_task(past).status == "pending"


@pytest.mark.parametrize("after", [[], [""], ["has space"], [3], b"x"])
def test_bad_parents_are_refused(client: blueque.Client, after: object) -> None:
    with pytest.raises(DependencyError):
        client.get_queue(Q).enqueue("x", after=after)


def test_unknown_parents_and_cycles_are_refused_writing_nothing(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    queue = client.get_queue(Q)
    known = queue.enqueue("k")
    before = sorted(redis_client.keys("*"))
    with pytest.raises(DependencyError, match=r"unknown task.*nope"):
        queue.enqueue("x", after=[known, "nope"])
    with pytest.raises(DependencyError, match="cycle"):
        queue.enqueue("x", task_id="me", after=[known, "me"])
    with pytest.raises(DependencyError, match="after_any"):
        queue.enqueue("x", after=known, after_any="yes")
    assert sorted(redis_client.keys("*")) == before


def test_enqueueing_an_existing_id_again_changes_nothing(client: blueque.Client,
                                                         redis_client: redis.Redis) -> None:
    queue = client.get_queue(Q)
    first, other = queue.enqueue("1"), queue.enqueue("2")
    assert queue.enqueue("c", task_id="child", after=first).created
    again = queue.enqueue("c", task_id="child", after=[other])
    assert not again.created
    assert client.get_task("child").after == [first]
    assert not redis_client.exists(f"blueque_dependents_{other}")


def test_enqueue_many_after_makes_every_task_wait(client: blueque.Client) -> None:
    queue = client.get_queue(Q)
    parent = queue.enqueue("p")
    batch = queue.enqueue_many(["a", "b"], after=parent)
    assert batch.created == 2
    assert {client.get_task(i).status for i in batch} == {"waiting"}
    _finish(client, parent)
    assert {client.get_task(i).status for i in batch} == {"pending"}


def test_the_sweep_tells_what_nobody_told(client: blueque.Client,
                                          redis_client: redis.Redis) -> None:
    """An ending recorded without telling (blueque 1.0.1's listener; a crash right after the
    ending) is found by the sweep once the waiting task's check is due."""
    queue = client.get_queue(Q)
    parent = queue.enqueue("p")
    child = queue.enqueue("c", after=parent)
    redis_client.hset(f"blueque_task_{parent}", mapping={"status": "complete"})  # as 1.0.1
    store = client.store
    now = store.now()
    assert store.perform(dependencies.settle_waiting, Q, now) == 0  # not due yet
    assert client.get_task(child).status == "waiting"
    assert store.perform(dependencies.settle_waiting, Q, now + dependencies.RECHECK) == 1
    assert client.get_task(child).status == "pending"


def test_a_waiting_task_still_waiting_is_checked_again_later(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    queue = client.get_queue(Q)
    child = queue.enqueue("c", after=queue.enqueue("p"))
    store = client.store
    due = store.now() + dependencies.RECHECK
    assert store.perform(dependencies.settle_waiting, Q, due) == 1
    assert redis_client.zscore(f"blueque_waiting_tasks_{Q}", child) == pytest.approx(
        due + dependencies.RECHECK)


# --- the command line ---------------------------------------------------------------------
def test_blueque_enqueue_after_then_status_and_show_say_what_it_waits_for(
        run: Run, run_json: Callable[..., Any], client: blueque.Client) -> None:
    first = run("enqueue", "pages", "1").stdout.strip()
    second = run("enqueue", "pages", "2").stdout.strip()
    done = run("enqueue", Q, "book", "--after", first, "--after", second)
    assert done.returncode == 0, done.stderr
    book = done.stdout.strip()
    assert client.get_task(book).after == [first, second]
    status = run("status").stdout
    header, row = status.splitlines()[0].split(), next(
        line for line in status.splitlines() if line.startswith(Q)).split()
    assert dict(zip(header, row, strict=False))["WAITING"] == "1"
    assert {q["name"]: q["waiting"] for q in run_json("status")["queues"]}[Q] == 1
    _finish(client, first)
    shown = run("show", book).stdout
    assert f"waiting for 1 of 2 parent(s) to end (runs when all complete): {second} (pending)" \
        in shown
    assert run_json("show", book)["awaiting"] == [second]
    assert run_json("show", book)["after"] == [first, second]


def test_blueque_enqueue_refuses_an_unknown_parent_and_a_lone_after_any(run: Run) -> None:
    done = run("enqueue", Q, "x", "--after", "nope")
    assert done.returncode != 0 and "unknown task(s) nope" in done.stderr
    assert run("enqueue", Q, "x", "--after-any").returncode != 0
    assert run("status").stdout.strip().startswith("no queues")


# --- chains and groups ------------------------------------------------------------------------
def test_a_chain_runs_each_step_after_the_one_before(client: blueque.Client) -> None:
    ids = flows.chain(client, [(Q, "a"), ("other", "b"), (Q, "c")])
    assert [client.get_task(i).status for i in ids] == ["pending", "waiting", "waiting"]
    assert [client.get_task(i).after for i in ids] == [[], [ids[0]], [ids[1]]]
    _finish(client, ids[0])
    _finish(client, ids[1], "failed")
    assert client.get_task(ids[2]).error == f"parent {ids[1]} failed: {ids[1]} broke"
    with pytest.raises(blueque.ConfigurationError):
        flows.chain(client, [])


def test_a_group_runs_its_callback_after_every_task(client: blueque.Client) -> None:
    made = flows.group(client, "pages", ["1", "2", "3"], then=(Q, "assemble"))
    assert len(made.task_ids) == 3 and client.get_task(made.callback).status == "waiting"
    for task_id in made.task_ids:
        _finish(client, task_id)
    callback = client.get_task(made.callback)
    assert callback.status == "pending"
    assert [p.result for p in callback.parents()] == [f"result of {i}" for i in made.task_ids]


def test_the_asyncio_chain_and_group(aio_client: Any, client: blueque.Client,
                                     aio_loop: Any) -> None:
    ids = aio_loop.run(flows.achain(aio_client.aio, [(Q, "a"), (Q, "b")]))
    assert client.get_task(ids[1]).after == [ids[0]]
    made = aio_loop.run(flows.agroup(aio_client.aio, "pages", ["1"], then=(Q, "c"),
                                     after_any=True))
    assert client.get_task(made.callback).data["after_any"] == "1"


def test_waiting_tasks_are_a_state_of_the_metrics(client: blueque.Client) -> None:
    queue = client.get_queue(Q)
    queue.enqueue("c", after=queue.enqueue("p"))
    text = metrics.scrape(metrics.queue_registry(client.store)).decode()
    assert f'blueque_tasks{{queue="{Q}",state="waiting"}} 1.0' in text
    assert f'blueque_tasks{{queue="{Q}",state="pending"}} 1.0' in text


# --- the dashboard ----------------------------------------------------------------------------
def test_the_dashboard_counts_waiting_tasks_and_links_parents_and_dependents(
        client: blueque.Client, redis_url: str, tmp_path: Path) -> None:
    queue = client.get_queue(Q)
    done, running = queue.enqueue("d"), client.get_queue("pages").enqueue("r")
    _finish(client, done)
    child = queue.enqueue("c", after=[done, running])
    dashboard = DashboardProcess(redis_url, tmp_path / "dashboard.log")
    try:
        _, page = get(f"{dashboard.url}/task?id={child}")
        parents = page[page.index('id="parents"'):]
        parents = parents[: parents.index("</ul>")]
        assert f'href="/task?id={done}"' in parents and f'href="/task?id={running}"' in parents
        assert 'state-complete">complete' in parents and 'state-pending">pending' in parents
        assert "runs if all complete" in page and 'id="cancel"' not in page  # read-only
        _, page = get(f"{dashboard.url}/task?id={running}")
        dependents = page[page.index('id="dependents"'):]
        assert f'href="/task?id={child}"' in dependents[: dependents.index("</ul>")]
        _, page = get(dashboard.url + "/")
        row = page[page.index(f'data-queue="{Q}"'):]
        assert re.search(r'state-waiting"><a [^>]*>1</a>', row[: row.index("</tr>")])
        _, page = get(f"{dashboard.url}/queue?name={Q}&state=waiting")
        assert f'href="/task?id={child}"' in page
    finally:
        dashboard.close()


def test_spark_lists_waiting_tasks_in_chunks(client: blueque.Client) -> None:
    # pyspark is the spark extra's: without it this module still collects, this test skips
    pytest.importorskip("pyspark")
    from blueque.spark.read import list_task_ids

    queue = client.get_queue(Q)
    parent = queue.enqueue("p")
    waiting = [queue.enqueue("c", after=parent) for _ in range(3)]
    ids = list_task_ids(client.store, Q, ["waiting", "pending"], chunk=2)
    assert set(ids[:3]) == set(waiting) and ids[3:] == [parent]


def test_every_recovery_sweep_settles_the_waiting_tasks_due_for_a_check(
        client: blueque.Client, redis_client: redis.Redis) -> None:
    """What the listener daemons and the scheduler run (Recovery.sweep) tells what nobody
    told: here a parent completed by a writer that tells nobody (as blueque 1.0.1)."""
    queue = client.get_queue(Q)
    parent = queue.enqueue("p")
    child = queue.enqueue("c", after=parent)
    redis_client.hset(f"blueque_task_{parent}", "status", "failed")
    Recovery(client.store, host="sweeper.example").sweep([Q])
    assert client.get_task(child).status == "waiting"  # its check is not due yet
    redis_client.zadd(f"blueque_waiting_tasks_{Q}", {child: 0})  # as RECHECK seconds later
    Recovery(client.store, host="sweeper.example").sweep([Q])
    assert client.get_task(child).status == "failed"
    assert client.get_task(child).error == f"parent {parent} failed"
