"""deploy/ (issue 31.4): the Kubernetes manifests are valid (Kubernetes' own schemas through
kubernetes-validate, KEDA's ScaledObject through its CRD's schema, vendored in
tests/schemas), and they, the Dockerfile and Blueque agree: the listener's arguments are ones
`blueque listen` takes, its pod's terminationGracePeriodSeconds outlasts its whole stop
(--preempt-grace, a task's kill_grace, the recording), and KEDA scales on a metric
`blueque metrics` serves."""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

import blueque
from blueque.cli import build_parser
from blueque.metrics import queue_registry, scrape
from blueque.policy import Policy
from tests.readme import DOCS, commands, markdown_blocks

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
#: the Kubernetes release the manifests are checked against (its schemas ship with
#: kubernetes-validate: no network)
KUBERNETES = "1.30.0"
#: seconds, past --preempt-grace and a task's kill_grace, to record the endings in Redis
RECORDING = 5


def documents() -> list[dict[str, Any]]:
    found = []
    for path in sorted((DEPLOY / "kubernetes").glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def one(kind: str, name: str) -> dict[str, Any]:
    return next(d for d in documents() if d["kind"] == kind and d["metadata"]["name"] == name)


def keda_schema() -> dict[str, Any]:
    crd = next(d for d in yaml.safe_load_all((ROOT / "tests" / "schemas" /
                                              "keda.sh_scaledobjects.yaml").read_text()) if d)
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@pytest.mark.parametrize("document", [d for d in documents() if d["kind"] != "ScaledObject"],
                         ids=lambda d: f"{d['kind']}-{d['metadata']['name']}")
def test_each_manifest_is_valid_kubernetes(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_the_scaled_object_is_valid_for_kedas_schema() -> None:
    validator = jsonschema.Draft7Validator(keda_schema())
    scaled = one("ScaledObject", "blueque-listener")
    assert list(validator.iter_errors(scaled)) == []
    broken = copy.deepcopy(scaled)  # the check is not vacuous
    broken["spec"]["minReplicaCount"] = "none"
    del broken["spec"]["scaleTargetRef"]
    assert len(list(validator.iter_errors(broken))) == 2


def test_the_validators_refuse_a_wrong_manifest() -> None:
    deployment = copy.deepcopy(one("Deployment", "blueque-listener"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 135  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES, strict=True)


def listener_container() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = one("Deployment", "blueque-listener")["spec"]["template"]["spec"]
    return pod, next(c for c in pod["containers"] if c["name"] == "listener")


def test_the_pods_grace_outlasts_the_listeners_whole_stop() -> None:
    pod, container = listener_container()
    args = build_parser().parse_args(["listen", *container["args"]])
    assert args.on_stop == "preempt"
    needed = args.preempt_grace + Policy().kill_grace + RECORDING
    assert pod["terminationGracePeriodSeconds"] >= needed
    assert pod["terminationGracePeriodSeconds"] <= needed + 30  # tied, not just large
    assert pod["serviceAccountName"] == one("ServiceAccount", "blueque-listener")[
        "metadata"]["name"]
    role = one("Role", "blueque-pod-deletion-cost")
    assert {"patch"} <= set(role["rules"][0]["verbs"]) and role["rules"][0]["resources"] == [
        "pods"]
    names = {e["name"] for e in container["env"]}
    assert {"BLUEQUE_URL", "POD_NAME"} <= names


def dockerfile_instruction(name: str) -> list[str]:
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    line = next(line for line in text.splitlines() if line.startswith(name + " "))
    value: list[str] = json.loads(line[len(name) + 1:])  # the exec form: a JSON list
    return value


def test_the_image_runs_the_listener_as_pid_1_with_the_deployments_arguments() -> None:
    assert dockerfile_instruction("ENTRYPOINT") == ["blueque", "listen"]
    _, container = listener_container()
    assert dockerfile_instruction("CMD") == container["args"]
    assert "command" not in container  # the image's entrypoint: the listener is pid 1
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY "):  # what it copies exists in the build context (the root)
            for source in shlex.split(line)[1:-1]:
                assert (ROOT / source).exists(), source


def test_keda_scales_on_a_metric_blueque_metrics_serves(client: blueque.Client) -> None:
    metrics = one("Deployment", "blueque-metrics")["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(metrics["command"][1:])
    assert args.port == 9309 and args.host == "0.0.0.0"
    trigger = one("ScaledObject", "blueque-listener")["spec"]["triggers"][0]
    query = trigger["metadata"]["query"]
    assert query == 'sum(blueque_queue_work{queue="reports"})'
    _, container = listener_container()
    listen = build_parser().parse_args(["listen", *container["args"]])
    assert listen.queues == "reports"
    assert int(trigger["metadata"]["threshold"]) == listen.concurrency
    client.get_queue("reports").enqueue("{}")
    served = scrape(queue_registry(client.store)).decode()
    assert 'blueque_queue_work{queue="reports"} 1.0' in served


def docs_block(section: str) -> str:
    return next(b.text for b in markdown_blocks(DOCS / "how-to" / "containers.md")
                if b.key == (section, 1))


def test_the_docs_listen_line_is_the_images() -> None:
    (line,) = commands(docs_block("Running listeners in containers and on Kubernetes"))
    words = shlex.split(line)
    assert words[:2] == ["blueque", "listen"]
    args = build_parser().parse_args(words[1:])
    assert (args.on_stop, args.preempt_grace) == ("preempt", 90.0)
    assert words[2:] == [w.replace("=", " ") for w in dockerfile_instruction("CMD")]


def test_the_docs_build_and_apply_lines_name_what_deploy_has() -> None:
    """Docker and a cluster are not here: each line's files, names and keys are deploy/'s."""
    build, secret, apply = (shlex.split(line) for line in commands(
        docs_block("The image and the manifests")))
    assert build[:3] == ["docker", "build", "-f"] and (ROOT / build[3]).is_file()
    image = build[build.index("-t") + 1]
    _, container = listener_container()
    assert container["image"] == f"{image}:latest" and build[-1] == "."  # the root: COPY's
    assert secret[:4] == ["kubectl", "create", "secret", "generic"]
    url = container["env"][0]["valueFrom"]["secretKeyRef"]
    assert secret[4] == url["name"] and secret[5].startswith(f"--from-literal={url['key']}=")
    assert apply[:3] == ["kubectl", "apply", "-f"] and documents()
    assert (ROOT / apply[3]).is_dir() and apply[3].rstrip("/") == "deploy/kubernetes"
