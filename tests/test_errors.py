"""Contract tests: the BluequeError hierarchy and messages that say what to do."""

from __future__ import annotations

import pytest
import redis

import blueque
import blueque.aio
from blueque.errors import (
    BluequeError,
    ConfigurationError,
    InvalidTaskState,
    RedisUnavailable,
    TaskNotFound,
    WritesRefused,
)
from blueque.store import translate
from blueque.testing import RedisServer, TLSFiles, free_port
from tests.aio_facade import AioClient, LoopThread


@pytest.fixture(params=["sync", "aio"])
def connect(request: pytest.FixtureRequest, aio_loop: LoopThread) -> object:
    """Makes a client of a URL: blueque.Client, or blueque.aio.Client behind its surface
    (tests/aio_facade.py); both must raise the same Blueque errors."""

    def make(url: str, **kwargs: object) -> blueque.Client:
        if request.param == "sync":
            return blueque.Client(url, **kwargs)
        return AioClient(blueque.aio.Client(url, **kwargs), aio_loop)  # type: ignore[return-value]

    return make


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://localhost:6379/0", "unsupported Redis URL"),
        ("localhost:6379", "unsupported Redis URL"),
        ("redis://localhost:99999/0", "bad port"),
        ("redis://localhost:port/0", "bad port"),
        ("redis://localhost:6379/zero", "bad database"),
        ("redis://:6379/0", "no host"),
        ("unix://", "no socket path"),
    ],
)
def test_bad_urls_raise_configuration_error(connect, url: str, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError, match=message) as raised:
        connect(url)
    assert isinstance(raised.value, BluequeError) and isinstance(raised.value, ValueError)


def test_a_password_in_a_bad_url_is_not_echoed(connect) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigurationError) as raised:
        connect("redis://user:s3cret@localhost:99999/0")
    assert "s3cret" not in str(raised.value)


def test_unreachable_redis_names_the_address(connect) -> None:  # type: ignore[no-untyped-def]
    port = free_port()  # nothing listens there
    # retried for 0.3 s (the default is 30 s), then RedisUnavailable
    client = connect(f"redis://127.0.0.1:{port}/0?retry_deadline=0.3",
                     socket_connect_timeout=1)
    try:
        with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{port}.*redis-server"):
            client.ping()
        with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{port}") as raised:
            client.get_queue("q").enqueue("p")
        assert isinstance(raised.value, ConnectionError)
        assert not isinstance(raised.value, redis.exceptions.RedisError)
    finally:
        client.close()


def test_redis_going_away_raises_redis_unavailable(connect) -> None:  # type: ignore[no-untyped-def]
    with RedisServer() as server:
        client = connect(server.url, socket_connect_timeout=1, retry_deadline=0.3)
        try:
            client.get_queue("q").enqueue("p")
            server.kill()
            with pytest.raises(RedisUnavailable, match=str(server.port)):
                client.get_queue("q").enqueue("p")
        finally:
            client.close()


def test_a_redis_client_without_decode_responses_is_refused(redis_url: str) -> None:
    raw = redis.Redis.from_url(redis_url)
    try:
        with pytest.raises(ConfigurationError, match="decode_responses=True"):
            blueque.Client(raw)
    finally:
        raw.close()


def test_a_ready_redis_client_with_decode_responses_is_used(redis_client: redis.Redis) -> None:
    client = blueque.Client(redis_client)
    assert client.redis is redis_client
    task_id = client.get_queue("q").enqueue("p")
    assert redis_client.hget(f"blueque_task_{task_id}", "status") == "pending"


def test_task_not_found_says_what_happened() -> None:
    error = TaskNotFound("t-1")
    assert isinstance(error, BluequeError) and isinstance(error, KeyError)
    assert error.task_id == "t-1"
    assert "never enqueued" in str(error) and "'t-1'" in str(error)


def test_invalid_task_state_is_a_value_error() -> None:
    assert issubclass(InvalidTaskState, ValueError)
    assert issubclass(InvalidTaskState, BluequeError)


def test_bad_queue_names_and_task_ids_are_refused(client: blueque.Client) -> None:
    with pytest.raises(ConfigurationError, match="queue name"):
        client.get_queue("")
    with pytest.raises(ConfigurationError, match="without spaces"):
        client.get_queue("q").enqueue("p", task_id="has space")


@pytest.mark.parametrize("name", ["", None, 3])
def test_both_clients_refuse_a_queue_name_that_is_no_name(contract_client: blueque.Client,
                                                          name: object) -> None:
    """One rule, one message, for the sync and the asyncio Queue; a name made before the
    queue-name rule (a colon) still names a queue to read."""
    with pytest.raises(ConfigurationError, match="a queue name must be a non-empty string"):
        contract_client.get_queue(name)  # type: ignore[arg-type]
    assert contract_client.get_queue("legacy:queue").name == "legacy:queue"


def test_an_unreachable_unix_socket_names_its_path(connect, tmp_path: object) -> None:  # type: ignore[no-untyped-def]
    path = f"{tmp_path}/no-redis.sock"
    client = connect(f"unix://{path}")
    try:
        with pytest.raises(RedisUnavailable, match=f"unix://{path}"):
            client.ping()
    finally:
        client.close()


def test_a_unix_socket_url_works(connect, tmp_path: object) -> None:  # type: ignore[no-untyped-def]
    socket_path = f"{tmp_path}/redis.sock"
    with RedisServer(extra_args=("--unixsocket", socket_path)) as server:
        client = connect(f"unix://{socket_path}?db=3")
        try:
            task_id = client.get_queue("q").enqueue("p")
            direct = redis.Redis(port=server.port, db=3, decode_responses=True)
            assert direct.hget(f"blueque_task_{task_id}", "status") == "pending"
            direct.close()
        finally:
            client.close()


def test_a_tls_certificate_the_client_refuses_is_a_configuration_error(  # type: ignore[no-untyped-def]
        connect, tmp_path) -> None:
    """A rediss:// URL whose server certificate the client does not accept (no ssl_ca_certs for
    a private CA, a host name the certificate does not name) will never connect: it is
    ConfigurationError at once, naming the TLS options, not RedisUnavailable after the whole
    retry_deadline with advice to check that redis-server is running. The right CA works."""
    tls = TLSFiles.self_signed(str(tmp_path))
    port = free_port()
    settings = tls.server_settings(port)
    with RedisServer(extra_args=tuple(f"--{item}" if i % 2 == 0 else item
                                      for i, item in enumerate(settings))):
        for url, why in ((f"rediss://127.0.0.1:{port}/0", "self-signed certificate"),
                         (f"rediss://localhost:{port}/0?ssl_ca_certs={tls.ca}",
                          "Hostname mismatch")):
            client = connect(url)
            try:
                with pytest.raises(ConfigurationError, match=f"TLS.*{why}.*ssl_ca_certs"):
                    client.get_queue("q").enqueue("p")
            finally:
                client.close()
        client = connect(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={tls.ca}")
        try:
            assert client.get_task(client.get_queue("q").enqueue("p")).status == "pending"
        finally:
            client.close()


def test_password_and_acl_user_in_the_url(connect) -> None:  # type: ignore[no-untyped-def]
    with RedisServer() as server:
        # set after start: RedisServer's readiness probe is an unauthenticated PING
        admin = redis.Redis(port=server.port)
        admin.acl_setuser("alice", enabled=True, passwords=["+alicepw"], keys=["*"],
                          channels=["*"], commands=["+@all"])
        admin.config_set("requirepass", "s3cret")
        admin.close()
        for credentials in (":s3cret", "alice:alicepw"):
            client = connect(f"redis://{credentials}@127.0.0.1:{server.port}/0")
            try:
                task_id = client.get_queue("q").enqueue("p")
                assert client.get_task(task_id).status == "pending"
            finally:
                client.close()
        wrong = connect(f"redis://alice:wrong@127.0.0.1:{server.port}/0")
        try:
            with pytest.raises(blueque.AuthenticationFailed, match=str(server.port)) as raised:
                wrong.get_queue("q").enqueue("p")
            assert "wrong" not in str(raised.value)
            assert not isinstance(raised.value, redis.exceptions.RedisError)
        finally:
            wrong.close()


@pytest.mark.parametrize("error", [
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    redis.exceptions.ResponseError("MASTERDOWN Link with MASTER is down"),
    redis.exceptions.ClusterDownError("The cluster is down"),
    redis.exceptions.TryAgainError("Multiple keys request during rehashing of slot"),
    redis.exceptions.ResponseError("BUSY Redis is busy running a script."),
])
def test_transient_server_states_are_unavailability_not_refusals(
        error: redis.exceptions.RedisError) -> None:
    """Retried by the policy and waited out by daemons: never "Redis refused"."""
    translated = translate(error, "127.0.0.1:1")
    assert isinstance(translated, RedisUnavailable)
    assert "cannot serve Blueque right now" in str(translated)
    refusal = translate(redis.exceptions.ResponseError("ERR unknown subcommand"), "h")
    assert type(refusal) is BluequeError


@pytest.mark.parametrize(("reply", "cause"), [
    ("OOM command not allowed when used memory > 'maxmemory'.",
     "Redis is out of memory (maxmemory reached, maxmemory-policy noeviction)"),
    ("MISCONF Errors writing to the AOF file: No space left on device",
     "Redis cannot persist (disk full, or an AOF/RDB write error)"),
])
def test_refused_writes_are_an_outage_that_names_its_cause(reply: str, cause: str) -> None:
    """Issue 19: a full disk or memory is WritesRefused (a RedisUnavailable, waited out by
    daemons), whose message says what is wrong, not "Redis refused a Blueque command"."""
    translated = translate(redis.exceptions.ResponseError(reply), "127.0.0.1:1")
    assert isinstance(translated, WritesRefused) and isinstance(translated, RedisUnavailable)
    assert translated.cause == cause
    assert str(translated).startswith(cause) and "127.0.0.1:1" in str(translated)


def test_an_unreachable_cluster_is_redis_unavailable(connect) -> None:  # type: ignore[no-untyped-def]
    """redis-py's cluster client connects at once (redis.asyncio's at the first command) and
    gives up with RedisClusterException, which is no RedisError: it must not reach the caller
    as it is."""
    port = free_port()
    url = f"redis+cluster://:secret@127.0.0.1:{port}?retry_deadline=0.3"
    with pytest.raises(RedisUnavailable, match=f"127.0.0.1:{port}") as raised:
        client = connect(url)
        try:
            client.ping()
        finally:
            client.close()
    assert "secret" not in str(raised.value)


def test_an_asyncio_client_without_decode_responses_is_refused(redis_url: str) -> None:
    raw = redis.asyncio.Redis.from_url(redis_url)
    with pytest.raises(ConfigurationError, match="decode_responses=True"):
        blueque.aio.Client(raw)
