"""blueque.config: every URL form parsed into Settings (Sentinel and Cluster URLs into an
HAEndpoint), the one password masker, the hash_tags layout option and its deprecated
``cluster`` alias: pure logic, no server."""

from __future__ import annotations

import pickle

import pytest
import redis

import blueque
import blueque.aio
from blueque.config import Settings, hide_password, settings_for
from blueque.errors import ConfigurationError
from blueque.ha import Durability, HAEndpoint
from blueque.retry import RetryPolicy


def endpoint(url: str) -> HAEndpoint:
    settings = Settings.from_url(url)
    assert settings.ha is not None
    return settings.ha


def test_sentinel_url_with_every_part() -> None:
    settings = Settings.from_url(
        "rediss+sentinel://app:s%40cret@s1:26380,s2,10.0.0.3:5000/jobs/4"
        "?sentinel_password=sp&wait_replicas=1&wait_timeout=250&socket_timeout=3"
        "&ssl_ca_certs=/etc/ca.pem"
    )
    ha = settings.ha
    assert ha is not None and ha.kind == "sentinel" and not settings.hash_tags
    assert ha.hosts == (("s1", 26380), ("s2", 26379), ("10.0.0.3", 5000))
    assert (ha.master_name, ha.db) == ("jobs", 4)
    assert (ha.username, ha.password) == ("app", "s@cret")
    assert ha.sentinel_password == "sp"
    assert ha.ssl and ha.ssl_options == {"ssl_ca_certs": "/etc/ca.pem"}
    assert ha.socket_timeout == 3.0
    assert settings.durability == Durability(1, 250)
    for shown in (repr(ha), repr(settings)):
        assert "s%40cret" not in shown and "s@cret" not in shown
        assert "sp" not in shown.replace("ssl", "")


def test_sentinel_url_defaults_and_db_option() -> None:
    settings = Settings.from_url("redis+sentinel://localhost/mymaster?db=2")
    ha = endpoint("redis+sentinel://localhost/mymaster?db=2")
    assert ha.hosts == (("localhost", 26379),)
    assert (ha.master_name, ha.db, ha.ssl) == ("mymaster", 2, False)
    assert ha.password is None and settings.durability is None
    assert settings.retry_policy() == RetryPolicy(30.0)


def test_ssl_check_hostname_is_a_boolean() -> None:
    ha = endpoint("rediss+cluster://n1:7000?ssl_check_hostname=false")
    assert ha.ssl_options == {"ssl_check_hostname": False}


def test_cluster_url() -> None:
    settings = Settings.from_url("redis+cluster://:pw@n1:7000,n2:7001/?retry_deadline=5")
    ha = settings.ha
    assert ha is not None and ha.cluster and ha.hosts == (("n1", 7000), ("n2", 7001))
    assert ha.password == "pw" and ha.username is None
    assert settings.retry_policy() == RetryPolicy(5.0)


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
        "redis+sentinel://s1/m?wait_replicas=-1",
        "redis+cluster://n1:7000?retry_deadline=-1",
        "redis+cluster://n1:7000?retry_deadline=inf",
    ],
)
def test_bad_urls_say_what_is_wrong(url: str) -> None:
    with pytest.raises(ConfigurationError):
        Settings.from_url(url)


def test_settings_hand_ha_urls_to_blueque_ha() -> None:
    settings = Settings.from_url("redis+cluster://n1:7000", wait_replicas=1)
    assert settings.hash_tags and settings.ha is not None and settings.ha.cluster
    assert settings.durability == Durability(1, 1000)
    # plain URLs retry too (30 s by default); retry_deadline=0 is one try
    assert Settings.from_url("redis://localhost/0").retry_policy() == RetryPolicy(30.0)
    assert Settings.from_url("redis://localhost/0?retry_deadline=0").retry_policy() is None
    assert Settings.from_url("unix:///run/r.sock?db=1&retry_deadline=2.5").retry_policy() == (
        RetryPolicy(2.5))
    assert Settings.from_url("rediss://h/0", retry_deadline=4).retry_policy() == RetryPolicy(4)




@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:secret@h:6379/0", "redis://:***@h:6379/0"),
        ("rediss://app:secret@h:6379/0", "rediss://app:***@h:6379/0"),
        ("redis://h:6379/0?client_name=x", "redis://h:6379/0?client_name=x"),
        # a lone credential is a user name to redis-py, and most likely a misplaced password
        ("redis://secret@h/0", "redis://***@h/0"),
        # an unescaped / or @ in the password: still hidden whole
        ("redis://:se/cr@et@h/0", "redis://:***@h/0"),
        ("unix:///run/r.sock?db=1&password=secret", "unix:///run/r.sock?db=1&password=***"),
        ("rediss+sentinel://app:secret@s1,s2:26380/m/1?sentinel_password=secret&db=1",
         "rediss+sentinel://app:***@s1,s2:26380/m/1?sentinel_password=***&db=1"),
        ("redis+cluster://:secret@n1:7000,n2:7001", "redis+cluster://:***@n1:7000,n2:7001"),
    ],
)
def test_hide_password(url: str, shown: str) -> None:
    assert hide_password(url) == shown


@pytest.mark.parametrize(
    "url",
    [
        "redis://:secret@h:notaport/0",
        "redis://:secret@h/zero",
        "redis://:secret@h/0?bogus=1",
        "http://:secret@h/0",
        "redis+sentinel://:secret@s1/m?bogus=1",
        "redis+sentinel://s1/m?sentinel_password=secret&bogus=1",  # the query is shown too
        "redis+sentinel://:secret@s1:x/m",
        "redis+cluster://:secret@n1:7000/3",
    ],
)
def test_no_url_error_shows_a_password(url: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Settings.from_url(url)
    assert "secret" not in str(raised.value) and "***" in str(raised.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://:secret@127.0.0.1:6390/2?retry_deadline=4",
        "unix:///run/r.sock?db=1",
        "rediss+sentinel://app:secret@s1,s2/m/1?sentinel_password=secret&wait_replicas=1"
        "&ssl_check_hostname=false",
        "redis+cluster://n1:7000,n2:7001?retry_deadline=0",
    ],
)
def test_settings_are_picklable_and_keep_secrets_out_of_repr(url: str) -> None:
    """What Spark hands its executors: the same settings, parsed once on the driver."""
    settings = Settings.from_url(url, hash_tags=True, socket_timeout=5, password="secret")
    copy = pickle.loads(pickle.dumps(settings))
    assert copy == settings and copy.hash_tags
    assert copy.retry_policy() == settings.retry_policy()
    assert "secret" not in repr(settings)


def test_settings_for_takes_a_url_or_a_ready_settings() -> None:
    settings = Settings.from_url("redis://h/0", socket_timeout=5)
    assert settings_for(settings) is settings
    assert settings_for("redis://h/0", socket_timeout=5) == settings
    tagged = settings_for(settings, hash_tags=True)
    assert tagged.hash_tags and tagged.redis_kwargs == {"socket_timeout": 5}
    with pytest.raises(ConfigurationError, match="socket_timeout"):
        settings_for(settings, socket_timeout=1)


def test_hash_tags_select_the_layout_and_cluster_is_their_deprecated_alias(
        redis_url: str, redis_client: redis.Redis) -> None:
    """Client(url, cluster=True) is public API since the Cluster issue: it keeps working
    exactly as hash_tags=True does, with a DeprecationWarning at the caller's line."""
    assert not blueque.Client(redis_url).keys.hash_tags
    tagged = blueque.Client(redis_url, hash_tags=True)
    with pytest.warns(DeprecationWarning, match="hash_tags=True") as warned:
        alias = blueque.Client(redis_url, cluster=True)
    assert warned[0].filename == __file__
    assert alias.keys == tagged.keys and alias.keys.hash_tags
    assert alias.settings is not None and alias.settings.hash_tags
    task_id = alias.get_queue("docs").enqueue("{}")
    assert task_id.startswith("{docs}")
    assert redis_client.lrange("blueque_pending_tasks_{docs}", 0, -1) == [task_id]
    assert tagged.get_task(task_id).status == "pending"
    with pytest.warns(DeprecationWarning):
        assert blueque.aio.Client(redis_url, cluster=True).keys.hash_tags
    assert blueque.aio.Client(redis_url, hash_tags=True).keys == tagged.keys
    for client in (tagged, alias):
        client.close()
