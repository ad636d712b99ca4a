"""A listener in a Kubernetes pod keeps its pod's deletion cost (the annotation
``controller.kubernetes.io/pod-deletion-cost``) at the number of runs it holds, so that a
ReplicaSet scaled in (by hand, an HPA, KEDA) removes idle pods before busy ones. It PATCHes
its own pod through the Kubernetes API with the pod's service account token (urllib, nothing
to install) when that number has changed, at most every half lease interval.

It can only where Kubernetes mounts a service account token (in-cluster) and the account may
``patch`` pods; the pod's name is $POD_NAME (the downward API) or its host name. Where it
cannot, it says so once in the log, with what to give it (docs/how-to/containers.md), and
the listener runs as ever.
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("blueque.daemon")

ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
#: Where Kubernetes mounts a pod's service account (token, ca.crt, namespace);
#: $BLUEQUE_SERVICE_ACCOUNT_DIR names another (a projected volume elsewhere, a test).
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: Seconds a PATCH may take: the loop waits for it, at a renewal.
TIMEOUT = 3.0
#: Seconds before a failed PATCH is tried again (a refusal is said once, not every renewal).
RETRY_AFTER = 60.0
HOW = ("give the pod a service account allowed to patch pods (deploy/kubernetes/"
       "listener.yaml's Role), and $POD_NAME from the downward API "
       "(docs/how-to/containers.md)")


@dataclass(frozen=True)
class PodLink:
    """How to reach one's own pod: the API's base URL, the pod's path, the token and CA."""

    base: str
    path: str
    token: str
    context: ssl.SSLContext


def pod_link(environ: Mapping[str, str]) -> PodLink | str:
    """The way to one's own pod, or why there is none (a sentence for the log)."""
    host = environ.get("KUBERNETES_SERVICE_HOST")
    if not host:
        return "not in a Kubernetes pod ($KUBERNETES_SERVICE_HOST is not set)"
    account = Path(environ.get("BLUEQUE_SERVICE_ACCOUNT_DIR") or SERVICE_ACCOUNT)
    try:
        token = (account / "token").read_text().strip()
        namespace = (account / "namespace").read_text().strip()
        context = ssl.create_default_context(cafile=str(account / "ca.crt"))
    except (OSError, ssl.SSLError) as error:
        return f"no service account token mounted at {account} ({error})"
    pod = environ.get("POD_NAME") or environ.get("HOSTNAME") or os.uname().nodename
    port = environ.get("KUBERNETES_SERVICE_PORT", "443")
    address = f"[{host}]" if ":" in host else host
    return PodLink(f"https://{address}:{port}", f"/api/v1/namespaces/{namespace}/pods/{pod}",
                   token, context)


class PodDeletionCost:
    """The pod's deletion cost, kept at the listener's busy slots (``update`` after each
    step: a PATCH when they changed, ``every`` seconds apart at most). ``link`` None: not in
    a pod it can patch (said once, at start)."""

    def __init__(self, listener: str, environ: Mapping[str, str] | None = None,
                 every: float = 0.0) -> None:
        environ = os.environ if environ is None else environ
        found = pod_link(environ)
        self.listener = listener
        self.link = found if isinstance(found, PodLink) else None
        self.cost: int | None = None  # the cost the pod has, as far as we know
        self.failed_at: float | None = None
        self.every, self.sent_at = every, -math.inf
        if isinstance(found, str):  # in a pod: a warning, with the way; elsewhere, a trace
            in_pod = bool(environ.get("KUBERNETES_SERVICE_HOST"))
            log.log(logging.WARNING if in_pod else logging.DEBUG,
                    "listener %s: pod deletion cost not kept: %s%s", listener, found,
                    f"; {HOW}" if in_pod else "")
        else:
            log.info("listener %s: keeps the deletion cost of pod %s at its busy slots",
                     listener, found.path.rsplit("/", 1)[-1])

    def update(self, busy: int, now: float) -> bool:
        """PATCH the annotation to ``busy`` if it changed; True if the pod has it now."""
        if self.link is None or busy == self.cost:
            return self.link is not None
        if self.failed_at is not None and now - self.failed_at < RETRY_AFTER:
            return False
        if now - self.sent_at < self.every:
            return False  # changes in between: the last one is sent when it is time
        self.sent_at = now
        body = json.dumps({"metadata": {"annotations": {ANNOTATION: str(busy)}}}).encode()
        request = urllib.request.Request(
            self.link.base + self.link.path, data=body, method="PATCH",
            headers={"Authorization": f"Bearer {self.link.token}",
                     "Content-Type": "application/merge-patch+json",
                     "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT, context=self.link.context):
                pass
        except (urllib.error.URLError, OSError, ValueError) as error:
            if self.failed_at is None:
                log.warning("listener %s: could not set its pod's deletion cost (%s); %s. "
                            "Tried again every %.0f s", self.listener, _why(error), HOW,
                            RETRY_AFTER)
            self.failed_at = now
            return False
        if self.failed_at is not None:
            log.info("listener %s: its pod's deletion cost is kept again", self.listener)
        self.cost, self.failed_at = busy, None
        return True


def _why(error: Exception) -> str:
    if isinstance(error, urllib.error.HTTPError):
        return f"the API answered {error.code} {error.reason}"
    return str(getattr(error, "reason", error))
