"""Sentinel and Cluster URL parsing, the failover retry policy: pure logic, no server."""

from __future__ import annotations

import pytest
import redis

from blueque.config import Settings
from blueque.errors import ConfigurationError
from blueque.ha import Durability, HASettings, NotReplicated, RetryPolicy, is_transient


def test_sentinel_url_with_every_part() -> None:
    settings = HASettings.from_url(
        "rediss+sentinel://app:s%40cret@s1:26380,s2,10.0.0.3:5000/jobs/4"
        "?sentinel_password=sp&wait_replicas=1&wait_timeout=250&socket_timeout=3"
        "&ssl_ca_certs=/etc/ca.pem"
    )
    assert settings.kind == "sentinel"
    assert settings.hosts == (("s1", 26380), ("s2", 26379), ("10.0.0.3", 5000))
    assert (settings.master_name, settings.db) == ("jobs", 4)
    assert (settings.username, settings.password) == ("app", "s@cret")
    assert settings.sentinel_password == "sp"
    assert settings.ssl and settings.ssl_options == {"ssl_ca_certs": "/etc/ca.pem"}
    assert settings.socket_timeout == 3.0
    assert settings.durability() == Durability(1, 250)
    assert "s@cret" not in repr(settings) and "sp" not in repr(settings).replace("ssl", "")


def test_sentinel_url_defaults_and_db_option() -> None:
    settings = HASettings.from_url("redis+sentinel://localhost/mymaster?db=2")
    assert settings.hosts == (("localhost", 26379),)
    assert (settings.master_name, settings.db, settings.ssl) == ("mymaster", 2, False)
    assert settings.password is None and settings.durability() is None
    assert settings.retry_policy().deadline_s == 30.0


def test_ssl_check_hostname_is_a_boolean() -> None:
    settings = HASettings.from_url("rediss+cluster://n1:7000?ssl_check_hostname=false")
    assert settings.ssl_options == {"ssl_check_hostname": False}


def test_cluster_url() -> None:
    settings = HASettings.from_url("redis+cluster://:pw@n1:7000,n2:7001/?retry_deadline=5")
    assert settings.cluster and settings.hosts == (("n1", 7000), ("n2", 7001))
    assert settings.password == "pw" and settings.username is None
    assert settings.retry_policy().deadline_s == 5.0


@pytest.mark.parametrize(
    "url",
    [
        "redis+sentinel://s1:26379",  # no master name
        "redis+sentinel://s1:26379/m/x",  # db not a number
        "redis+sentinel://s1:notaport/m",
        "redis+sentinel://s1/m?bogus=1",
        "redis+sentinel://s1/m?wait_replicas=two",
        "redis+cluster://n1:7000/3",  # a cluster has db 0 only
        "redis+cluster://",
        "sentinel://s1/m",
        "rediss+sentinel://s1/m?ssl_check_hostname=maybe",
    ],
)
def test_bad_urls_say_what_is_wrong(url: str) -> None:
    with pytest.raises(ConfigurationError):
        HASettings.from_url(url)


def test_settings_hand_ha_urls_to_blueque_ha() -> None:
    settings = Settings.from_url("redis+cluster://n1:7000", wait_replicas=1)
    assert settings.cluster and settings.ha is not None
    assert settings.durability() == Durability(1, 1000)
    # plain URLs retry too (30 s by default); retry_deadline=0 is one try
    assert Settings.from_url("redis://localhost/0").retry_policy() == RetryPolicy(30.0)
    assert Settings.from_url("redis://localhost/0?retry_deadline=0").retry_policy() is None
    assert Settings.from_url("unix:///run/r.sock?db=1&retry_deadline=2.5").retry_policy() == (
        RetryPolicy(2.5))
    assert Settings.from_url("rediss://h/0", retry_deadline=4).retry_policy() == RetryPolicy(4)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (redis.exceptions.ConnectionError("refused"), True),
        (redis.exceptions.TimeoutError("slow"), True),
        (redis.exceptions.ReadOnlyError("READONLY You can't write against a replica."), True),
        (redis.exceptions.ResponseError("UNBLOCKED force unblock"), True),
        (redis.exceptions.ResponseError("MASTERDOWN Link with MASTER is down"), True),
        (redis.exceptions.ClusterDownError("CLUSTERDOWN The cluster is down"), True),
        (redis.exceptions.TryAgainError("TRYAGAIN"), True),
        (NotReplicated("0 of 1"), True),
        (redis.exceptions.AuthenticationError("WRONGPASS"), False),
        (redis.exceptions.ResponseError("BLUEQUE_STATE task x is complete"), False),
        (ValueError("bug"), False),
    ],
)
def test_transient_errors(error: Exception, transient: bool) -> None:
    assert is_transient(error) is transient


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_retry_policy_rides_through_transient_failures() -> None:
    fake = FakeClock()
    policy = RetryPolicy(deadline_s=10, sleep=fake.sleep, clock=fake.clock)
    failures = [redis.exceptions.ConnectionError("down"), redis.exceptions.ReadOnlyError("RO")]

    def operation() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    assert policy.call(operation) == "done"
    assert len(fake.sleeps) == 2 and all(0 < s <= 0.5 for s in fake.sleeps)


def test_retry_policy_gives_up_at_its_deadline() -> None:
    fake = FakeClock()
    policy = RetryPolicy(deadline_s=3, sleep=fake.sleep, clock=fake.clock)
    calls = []

    def operation() -> None:
        calls.append(fake.now)
        raise redis.exceptions.ConnectionError("down")

    with pytest.raises(redis.exceptions.ConnectionError):
        policy.call(operation)
    assert fake.now == pytest.approx(3.0)
    assert max(fake.sleeps) <= 0.5 and len(calls) > 6


def test_retry_policy_never_repeats_a_permanent_error() -> None:
    calls = []

    def operation() -> None:
        calls.append(1)
        raise redis.exceptions.ResponseError("BLUEQUE_STATE task t is complete")

    with pytest.raises(redis.exceptions.ResponseError):
        RetryPolicy(deadline_s=10).call(operation)
    assert calls == [1]
