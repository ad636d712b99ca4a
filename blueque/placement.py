"""Fleet controls a task carries (PROTOCOL.md 5.22): its concurrency key (at most the key's
limit of runs at once across the fleet) and the resources it requires (a listener takes it only
if its free resources cover them). The words and their checks; the scripts (lua/lib/keyed.lua)
apply them when a listener takes a task.

Amounts are numbers with an optional suffix: K, M, G, T (powers of 1000) and Ki, Mi, Gi, Ti
(powers of 1024), as Kubernetes writes quantities: ``memory=64G``, ``memory=16Gi``, ``gpu=2``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping

from blueque.errors import ConfigurationError

#: The task options this module checks (``Queue.enqueue(..., concurrency_key=..., requires=
#: ...)``, and as queue defaults through ``Queue.configure``).
PLACEMENT_OPTIONS = ("concurrency_key", "requires")

SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
            "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_AMOUNT = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]i?)?\s*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-/]*")
#: The longest concurrency key (it is part of three key names).
KEY_MAX_LENGTH = 200

Resources = dict[str, float]


def parse_amount(value: object, name: str) -> float:
    """A resource amount: a number at least 0, or text with a suffix (``"16G"``, ``"512Mi"``)."""
    if isinstance(value, bool):
        raise ConfigurationError(f"resource {name}={value!r} is not an amount")
    if isinstance(value, int | float):
        number = float(value)
    elif isinstance(value, str) and (match := _AMOUNT.fullmatch(value)):
        number = float(match.group(1)) * SUFFIXES[match.group(2) or ""]
    else:
        raise ConfigurationError(
            f"resource {name}={value!r} is not an amount: a number with an optional suffix "
            f"K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (of 1024), such as 2, 16G or 512Mi")
    if not math.isfinite(number) or number < 0:
        raise ConfigurationError(f"resource {name}={value!r} must be a finite amount, at least 0")
    return number


def check_resource_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ConfigurationError(
            f"resource name {name!r} must be a letter or _ then letters, digits, _ . - /")
    return name


def parse_resources(spec: str) -> Resources:
    """``blueque listen --resources gpu=2,memory=64G``: name -> amount."""
    resources: Resources = {}
    for part in spec.split(","):
        name, equals, amount = part.strip().partition("=")
        if not equals:
            raise ConfigurationError(
                f"--resources item {part.strip()!r} is not NAME=AMOUNT (gpu=2,memory=64G)")
        name = check_resource_name(name.strip())
        if name in resources:
            raise ConfigurationError(f"--resources names {name} twice")
        resources[name] = parse_amount(amount.strip(), name)
    return resources


def requirements(value: object) -> Resources:
    """A task's ``requires`` option as given (``{"gpu": 1, "memory": "16G"}``): name -> amount.
    ConfigurationError for anything else."""
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"requires={value!r} must be a mapping of resource name to amount, "
            f"such as {{'gpu': 1, 'memory': '16G'}}")
    return {check_resource_name(name): parse_amount(amount, name)
            for name, amount in value.items()}


def check_key(value: object) -> str:
    """A concurrency key: non-empty printable text without whitespace, at most 200 long."""
    if (not isinstance(value, str) or not value or len(value) > KEY_MAX_LENGTH
            or any(c.isspace() or not c.isprintable() for c in value)):
        raise ConfigurationError(
            f"concurrency_key={value!r} must be non-empty printable text without whitespace, "
            f"at most {KEY_MAX_LENGTH} characters")
    return value


def encode(name: str, value: object) -> str:
    """A placement option's hash field value (PLACEMENT_OPTIONS), checked."""
    if name == "concurrency_key":
        return check_key(value)
    return encode_resources(requirements(value))


def encode_resources(resources: Mapping[str, float]) -> str:
    """The JSON of a task's ``requires`` or a listener's ``resources`` (whole numbers as
    integers: what the scripts and people read)."""
    return json.dumps({name: int(amount) if amount == int(amount) else amount
                       for name, amount in sorted(resources.items())}, separators=(",", ":"))


def decode_resources(raw: str | None) -> Resources:
    """A ``requires`` or ``resources`` field as stored; missing or corrupt: none (a corrupt
    option never blocks a task, as the scripts read it too)."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(name): float(amount) for name, amount in value.items()
            if isinstance(amount, int | float) and not isinstance(amount, bool)
            and math.isfinite(amount)}


def fits(free: Mapping[str, float], required: Mapping[str, float]) -> bool:
    """Whether ``free`` covers every amount of ``required`` (a name ``free`` lacks: 0)."""
    return all(free.get(name, 0.0) >= amount for name, amount in required.items())


def free_resources(total: Mapping[str, float], used: Iterable[Mapping[str, float]]
                   ) -> Resources:
    """``total`` less what each of ``used`` requires (a run's requires, running or adopted)."""
    free = dict(total)
    for required in used:
        for name, amount in required.items():
            free[name] = free.get(name, 0.0) - amount
    return free


def format_resources(resources: Mapping[str, float]) -> str:
    """``gpu=2,memory=64G`` back for people (exact multiples of 1000 or 1024 shortened)."""
    def amount(value: float) -> str:
        for suffix in ("Ti", "T", "Gi", "G", "Mi", "M", "Ki", "K"):
            unit = SUFFIXES[suffix]
            if value >= unit and value % unit == 0:
                return f"{int(value // unit)}{suffix}"
        return f"{int(value)}" if value == int(value) else f"{value:g}"
    return ",".join(f"{name}={amount(value)}" for name, value in sorted(resources.items()))
