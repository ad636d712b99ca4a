"""The dashboard's ASGI application (Starlette + Jinja2), mountable in any ASGI service.

Read-only unless a token is configured. With one, actions (cancel, retry, retry all failed,
empty, purge, pause and resume a queue) are JSON POSTs that must carry the token in the
``X-Blueque-Token`` header and come from the dashboard's own origin (``Origin``, else
``Referer``): a cross-site form cannot set the header nor the JSON content type without a
CORS preflight, which is never granted, and a cross-site page cannot read the token (kept in
the tab's sessionStorage). Every
value from Redis goes through Jinja2's autoescaping; the page script only moves server-
rendered nodes and sets text, and the Content-Security-Policy allows scripts and styles from
the dashboard only. With ``allowed_hosts`` (``blueque dashboard`` on a loopback address),
requests that name another host are refused: a web page that points its own name at 127.0.0.1
(DNS rebinding) cannot read the dashboard.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any
from urllib.parse import urlencode, urlsplit

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

from blueque.client import Client
from blueque.cron import CronEntry
from blueque.display import format_seconds, parse_duration
from blueque.errors import (
    BluequeError,
    ConfigurationError,
    InvalidTaskState,
    RedisUnavailable,
    TaskNotFound,
)
from blueque.eviction import FIX, MemoryPolicy
from blueque.hosts import HostRule
from blueque.metrics import queue_registry, scrape
from blueque.queue import Queue
from blueque.web import bulk, redis_panel, render, task_page, views
from blueque.web.search import STATES, Filters

log = logging.getLogger("blueque.web")

TOKEN_HEADER = "X-Blueque-Token"
#: Seconds between live refreshes of a page (the page script polls it with fetch).
DEFAULT_REFRESH = 2.0
#: Seconds a reading of Redis' maxmemory-policy is shown before it is read again (pages of
#: every open tab refresh every few seconds; the policy seldom changes).
POLICY_KEPT = 10.0
#: Seconds a page (or a /metrics scrape) keeps retrying a Redis that went away before it
#: answers 503: the client's whole retry_deadline would hold the request for 30 s.
PAGE_RETRY = 1.0
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; "
                               "img-src 'self' data:; frame-ancestors 'none'; "
                               "base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


class Dashboard:
    """Holds the client, the token and the cron entries; its methods are the routes."""

    def __init__(self, client: Client, token: str | None, cron_entries: Sequence[CronEntry],
                 refresh: float) -> None:
        self.client = client
        # pages wait at most a moment for Redis (then 503, and the page retries itself)
        self.store = client.store.bounded(PAGE_RETRY)
        self.token = token or None
        self.cron_entries = list(cron_entries)
        self.refresh = refresh
        self.templates = Jinja2Templates(env=render.environment())
        self.registry = queue_registry(self.store)
        self._policy: tuple[float, MemoryPolicy | None] = (-POLICY_KEPT, None)

    def memory_policy(self) -> MemoryPolicy | None:
        """Redis' maxmemory-policy (blueque.eviction), read at most every POLICY_KEPT
        seconds; None while Redis does not answer."""
        read_at, policy = self._policy
        current = time.monotonic()
        if current - read_at >= POLICY_KEPT:
            try:
                policy = self.store.memory_policy()
            except BluequeError:
                policy = None
            self._policy = (current, policy)
        return policy

    # --- pages ---------------------------------------------------------------------------------
    async def now(self) -> float:
        """Now on Redis' clock (a TIME round trip once a minute: off the event loop)."""
        return await run_in_threadpool(self.store.now)

    async def render(self, request: Request, name: str, context: dict[str, Any],
                     status: int = 200) -> Response:
        at = await self.now()
        policy = await run_in_threadpool(self.memory_policy)
        context.update(at=at, actions=self.token is not None, refresh=self.refresh,
                       evicting=policy if policy is not None and policy.evicts else None,
                       fix=FIX,
                       states=STATES, page_name=name.removesuffix(".html"),
                       **_links(request))
        response = self.templates.TemplateResponse(request, name, context, status_code=status)
        response.headers.update(SECURITY_HEADERS)
        return response

    def guard(self, route: Callable[[Request], Awaitable[Response]]
              ) -> Callable[[Request], Awaitable[Response]]:
        """Redis errors become a page that says so (503 while Redis is unreachable), never a
        stack trace; the page script shows the real page by itself once Redis answers."""

        async def guarded(request: Request) -> Response:
            try:
                return await route(request)
            except RedisUnavailable as error:  # the store's retries log it already
                title, detail, status = "Redis is unreachable", str(error), 503
            except BluequeError as error:
                title, detail, status = "Blueque refused", str(error), 500
                log.warning("dashboard %s: %s", request.url.path, error)
            return await self.render(request, "error.html", {
                "title": title, "detail": detail, "unreachable": status == 503}, status)

        return guarded

    async def queues(self, request: Request) -> Response:
        page = _int(request.query_params.get("page"), 1)
        span = request.query_params.get("range", "1h")
        data = await run_in_threadpool(views.queues_page, self.store, await self.now(), page,
                                       span)
        return await self.render(request, "queues.html", data)

    async def queue(self, request: Request) -> Response:
        name = request.query_params.get("name", "")
        state = request.query_params.get("state")
        if state not in views.VIEWS:
            state = None  # the queue's first state with tasks (views.queue_page)
        page = _int(request.query_params.get("page"), 1)
        filters = Filters.parse(request.query_params)
        start = _int(request.query_params.get("offset"), 0)
        data = await run_in_threadpool(views.queue_page, self.store, name, state, page,
                                       filters, await self.now(), start)
        return await self.render(request, "queue.html", data, 200 if data["known"] else 404)

    async def task(self, request: Request) -> Response:
        task_id = request.query_params.get("id", "")
        attempt = request.query_params.get("attempt") or None
        current = await self.now()
        data = await run_in_threadpool(task_page.task_page, self.store, task_id, current, attempt)
        if data is None:
            return await self.render(request, "missing.html", {"task_id": task_id}, 404)
        return await self.render(request, "task.html", {"task": data})

    async def nodes(self, request: Request) -> Response:
        page = _int(request.query_params.get("page"), 1)
        data = await run_in_threadpool(views.nodes_page, self.store, await self.now(), page)
        return await self.render(request, "nodes.html", data)

    async def schedule(self, request: Request) -> Response:
        page = _int(request.query_params.get("page"), 1)
        data = await run_in_threadpool(views.schedule_page, self.store, self.cron_entries,
                                       await self.now(), page)
        return await self.render(request, "schedule.html", data)

    async def redis(self, request: Request) -> Response:
        data = await run_in_threadpool(redis_panel.redis_page, self.store)
        return await self.render(request, "redis.html", data)

    async def metrics(self, request: Request) -> Response:
        body = await run_in_threadpool(scrape, self.registry)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    # --- actions ---------------------------------------------------------------------------------
    def refusal(self, request: Request) -> str | None:
        """Why an action request is refused, or None to let it through."""
        if self.token is None:
            return "actions are off: start the dashboard with a token to enable them"
        given = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            return "a valid token is required for actions"
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return "actions are JSON requests"
        source = request.headers.get("origin") or request.headers.get("referer")
        if not source:
            return "cross-site check failed: no Origin or Referer"
        origin = urlsplit(source)
        # behind a proxy that terminates TLS the page is https and the request it forwards
        # http; never the other way round
        schemes = {request.url.scheme} | ({"https"} if request.url.scheme == "http" else set())
        if origin.scheme not in schemes or origin.netloc != request.url.netloc:
            return "cross-site check failed: the request comes from another site"
        return None

    async def action(self, request: Request) -> Response:
        refused = self.refusal(request)
        if refused is not None:
            log.warning("dashboard action refused: %s", refused)
            return JSONResponse({"ok": False, "message": refused}, status_code=403,
                                headers=SECURITY_HEADERS)
        try:
            body = await request.json()
        except json.JSONDecodeError:
            body = None
        if not isinstance(body, dict):
            return JSONResponse({"ok": False, "message": "send a JSON object"}, 400,
                                headers=SECURITY_HEADERS)
        name = request.path_params["name"]
        handler = ACTIONS.get(name)
        if handler is None:
            return JSONResponse({"ok": False, "message": f"no action {name!r}"}, 404,
                                headers=SECURITY_HEADERS)
        try:
            message = await run_in_threadpool(handler, self, body)
        except (TaskNotFound, InvalidTaskState, ValueError) as error:
            return JSONResponse({"ok": False, "message": str(error)}, 409,
                                headers=SECURITY_HEADERS)
        except RedisUnavailable as error:
            return JSONResponse({"ok": False, "message": str(error)}, 503,
                                headers=SECURITY_HEADERS)
        except BluequeError as error:
            log.warning("dashboard action %s: %s", name, error)
            return JSONResponse({"ok": False, "message": str(error)}, 500,
                                headers=SECURITY_HEADERS)
        log.info("dashboard action %s: %s", name, message)
        return JSONResponse({"ok": True, "message": message}, headers=SECURITY_HEADERS)

    def cancel(self, body: dict[str, Any]) -> str:
        task_id = _text(body, "task_id")
        outcome = self.client.cancel_task(task_id, "cancelled from the dashboard")
        return (f"task {task_id} cancelled: it will not run" if outcome == "cancelled"
                else f"task {task_id} is running: its listener was told to stop it")

    def retry(self, body: dict[str, Any]) -> str:
        task_id = _text(body, "task_id")
        queue = self.client.get_task(task_id, missing_ok=True).queue
        if queue is None:
            raise TaskNotFound(task_id)
        self.store.retry_failed(queue, task_id, self.store.now())
        return f"task {task_id} is pending again"

    def retry_failed(self, body: dict[str, Any]) -> str:
        """Every failed task, oldest first; the cancelled ones are left alone."""
        queue = Queue(_text(body, "queue"), self.store)
        retried = queue.retry_failed()
        left = queue.stats().cancelled
        return (f"{len(retried)} failed task(s) of {queue.name} are pending again"
                + (f"; {left} cancelled task(s) left alone" if left else ""))

    def cancel_waiting(self, body: dict[str, Any]) -> str:
        """Empty the queue: cancel every pending and scheduled task (running ones go on)."""
        queue = Queue(_text(body, "queue"), self.store)
        done = queue.cancel_waiting(reason="the queue was emptied from the dashboard")
        return (f"{done.pending} pending and {done.scheduled} scheduled task(s) of "
                f"{queue.name} cancelled; running tasks go on")

    def pause(self, body: dict[str, Any]) -> str:
        queue = Queue(_text(body, "queue"), self.store)
        queue.pause(str(body.get("reason") or "").strip() or "paused from the dashboard")
        return f"queue {queue.name} paused: no listener starts its tasks; running ones go on"

    def resume(self, body: dict[str, Any]) -> str:
        queue = Queue(_text(body, "queue"), self.store)
        return (f"queue {queue.name} resumed: its listeners start its tasks again"
                if queue.resume() else f"queue {queue.name} was not paused")

    def purge(self, body: dict[str, Any]) -> str:
        queue = _text(body, "queue")
        status = _text(body, "status")
        older_than = _age(body.get("older_than", 0))
        deleted = Queue(queue, self.store).purge(status, older_than)
        if older_than == 0:
            return f"{deleted} {status} task(s) of {queue} deleted (every one)"
        return (f"{deleted} {status} task(s) of {queue} that finished more than "
                f"{format_seconds(older_than)} ago deleted")


ACTIONS: dict[str, Callable[[Dashboard, dict[str, Any]], str]] = {
    "cancel": Dashboard.cancel,
    "retry": Dashboard.retry,
    "retry-failed": Dashboard.retry_failed,
    "cancel-waiting": Dashboard.cancel_waiting,
    "purge": Dashboard.purge,
    "pause": Dashboard.pause,
    "resume": Dashboard.resume,
    "bulk-retry": lambda dashboard, body: bulk.retry(dashboard.client, body),
    "bulk-cancel": lambda dashboard, body: bulk.cancel(dashboard.client, body),
    "bulk-delete": lambda dashboard, body: bulk.delete(dashboard.client, body),
}


def _age(value: object) -> float:
    """An age: seconds as a number, or a duration as text (``7d``, ``90``, ``15m``)."""
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ConfigurationError as error:
            raise ValueError(f"older_than: {error}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"older_than must be seconds or a duration such as 7d, not {value!r}")
    return float(value)


def _links(request: Request) -> dict[str, Callable[..., str]]:
    """Path-only links (no scheme or host: right behind any reverse proxy), under the mount
    point when the dashboard is mounted in another app."""

    def link_to(route: str, /, **query: object) -> str:
        path = request.url_for(route).path
        shown = {key: str(value) for key, value in query.items() if value is not None}
        return path + ("?" + urlencode(shown) if shown else "")

    def static(path: str) -> str:
        return request.url_for("static", path=path).path

    def action_path(name: str) -> str:
        return request.url_for("action", name=name).path

    return {"link_to": link_to, "static": static, "action_path": action_path}


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"give {name} as a non-empty string")
    return value


def _int(raw: str | None, default: int) -> int:
    try:
        return int(raw) if raw else default
    except ValueError:
        return default


class HostCheck:
    """ASGI wrapper answering only requests whose ``Host`` names one of ``allowed`` (the rule
    of blueque.hosts: a dashboard on 127.0.0.1 is otherwise readable by any web page its user
    opens that points its own name at 127.0.0.1, DNS rebinding)."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app, self.rule = app, HostRule.of(allowed, "dashboard")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = Headers(scope=scope).get("host", "")
            message = self.rule.refusal(host)
            if message is not None:
                log.warning("dashboard: refused a request for host %r", host)
                await PlainTextResponse(message, 400, headers=SECURITY_HEADERS)(
                    scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(url: str | None = None, token: str | None = None, *, client: Client | None = None,
               cron_entries: Sequence[CronEntry] = (), refresh: float = DEFAULT_REFRESH,
               debug: bool = False, allowed_hosts: Sequence[str] | None = None) -> Starlette:
    """The dashboard as an ASGI app. ``url`` (or a ready ``client``) names the Redis;
    ``token`` enables actions; ``cron_entries`` (the scheduler's) show their next runs;
    ``allowed_hosts``, the host names requests may name (``HostCheck``; None: any).

    Mount it in a Starlette or FastAPI service: ``app.mount("/blueque", create_app(url))``."""
    if client is None:
        client = Client(url) if url else Client()
    dashboard = Dashboard(client, token, cron_entries, refresh)
    routes = [
        Route("/", dashboard.guard(dashboard.queues), name="queues"),
        Route("/queue", dashboard.guard(dashboard.queue), name="queue"),
        Route("/task", dashboard.guard(dashboard.task), name="task"),
        Route("/nodes", dashboard.guard(dashboard.nodes), name="nodes"),
        Route("/schedule", dashboard.guard(dashboard.schedule), name="schedule"),
        Route("/redis", dashboard.guard(dashboard.redis), name="redis"),
        Route("/metrics", dashboard.metrics, name="metrics"),
        Route("/actions/{name}", dashboard.action, methods=["POST"], name="action"),
        Mount("/static", StaticFiles(packages=[("blueque.web", "static")]), name="static"),
    ]
    middleware = [] if allowed_hosts is None else [Middleware(HostCheck,
                                                             allowed=list(allowed_hosts))]
    app = Starlette(debug=debug, routes=routes, middleware=middleware)
    app.state.dashboard = dashboard
    return app
