"""A Sentinel-watched master with replicas on loopback (see topology.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from blueque.errors import ConfigurationError, RedisUnavailable
from blueque.private_redis import RedisServer, free_port, kill_process, stop_process
from blueque.testing.nodes import (
    FAST_REPLICATION,
    _as_args,
    _as_config,
    _ask,
    _Topology,
)
from blueque.testing.polling import wait_for


@dataclass(frozen=True)
class TLSFiles:
    """A certificate, its key and the CA that signed it (here: itself), as files."""

    cert: str
    key: str
    ca: str

    @classmethod
    def self_signed(cls, directory: str) -> TLSFiles:
        """A throw-away certificate for 127.0.0.1, made with the openssl command."""
        openssl = shutil.which("openssl")
        if openssl is None:
            raise ConfigurationError("openssl not found on PATH (Debian: apt-get install openssl)")
        cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, stdin=subprocess.DEVNULL, capture_output=True, timeout=60,
        )
        return cls(cert=cert, key=key, ca=cert)

    def server_settings(self, tls_port: int) -> list[str]:
        """Config directives (name, value...) for a server or sentinel also listening on TLS."""
        return [
            "tls-port", str(tls_port), "tls-cert-file", self.cert, "tls-key-file", self.key,
            "tls-ca-cert-file", self.ca, "tls-replication", "yes", "tls-auth-clients", "no",
        ]


@dataclass
class SentinelProcess:
    """One ``redis-server --sentinel`` child monitoring one master."""

    master_name: str
    master_port: int
    quorum: int
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    port: int = 0
    executable: str = "redis-server"
    directory: str | None = None
    tls: TLSFiles | None = None
    #: extra config lines, e.g. an ACL user for clients ("user watcher on >pw +@all")
    extra_config: Sequence[str] = ()
    tls_port: int = field(default=0, init=False)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def client_port(self) -> int:
        """The port clients use: the TLS port when TLS is on (the plain one stays for probes)."""
        return self.tls_port or self.port

    @property
    def pid(self) -> int:
        assert self.process is not None, "sentinel not started"
        return self.process.pid

    def start(self, timeout: float = 10.0) -> SentinelProcess:
        path = shutil.which(self.executable)
        if path is None:
            raise ConfigurationError(f"{self.executable} not found on PATH")
        self.port = self.port or free_port()
        self.directory = tempfile.mkdtemp(prefix="blueque-sentinel-")
        config = os.path.join(self.directory, "sentinel.conf")
        name = self.master_name
        with open(config, "w", encoding="utf-8") as out:
            # sentinel rewrites this file as it learns the topology: it must be writable
            out.write(
                f"port {self.port}\nbind 127.0.0.1\ndaemonize no\ndir {self.directory}\n"
                f"logfile {os.path.join(self.directory, 'sentinel.log')}\n"
                f"sentinel monitor {name} 127.0.0.1 {self.master_port} {self.quorum}\n"
                f"sentinel down-after-milliseconds {name} {self.down_after_ms}\n"
                f"sentinel failover-timeout {name} {self.failover_timeout_ms}\n"
                f"sentinel parallel-syncs {name} 1\n"
            )
            if self.tls is not None:
                self.tls_port = free_port()
                out.write(_as_config(self.tls.server_settings(self.tls_port)))
            out.writelines(line + "\n" for line in self.extra_config)
        self.process = subprocess.Popen([path, config, "--sentinel"], stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: _ask(self.port, "PING") is True or self._exited(), timeout)
        except TimeoutError:
            self.stop()
            raise RedisUnavailable(f"sentinel on port {self.port} did not start") from None
        if self._exited():
            self.stop()
            raise RedisUnavailable(f"sentinel on port {self.port} exited at start")
        return self

    def _exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def master_state(self) -> dict[str, str]:
        """``SENTINEL MASTER`` as a dict of strings, empty if the sentinel does not answer."""
        reply = _ask(self.port, "SENTINEL", "MASTER", self.master_name)
        if isinstance(reply, dict):  # redis-py parses the flat reply into a dict
            return {str(k): str(v) for k, v in reply.items()}
        if isinstance(reply, list):
            return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}
        return {}

    def kill(self) -> None:
        kill_process(self.process)

    def stop(self) -> None:
        stop_process(self.process)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


@dataclass
class SentinelTopology(_Topology):
    """A master, its replicas and the sentinels watching them, all children of this process.

    With ``tls``, servers and sentinels also listen on TLS ports and replicate and monitor over
    TLS; clients get the TLS ports (``url`` uses ``rediss+sentinel://``). ``acl`` lines add
    users to the servers, ``sentinel_acl`` lines to the sentinels; the default user stays
    open on loopback for the probes, replication and monitoring. ``url_auth`` and
    ``url_options`` go into ``url`` as they are."""

    replicas: int = 2
    sentinels: int = 3
    master_name: str = "blueque"
    down_after_ms: int = 1000
    failover_timeout_ms: int = 5000
    extra_args: Sequence[str] = ()
    tls: TLSFiles | None = None
    acl: Sequence[str] = ()
    sentinel_acl: Sequence[str] = ()
    url_auth: str = ""
    url_options: str = ""
    servers: list[RedisServer] = field(default_factory=list, init=False)
    sentinel_processes: list[SentinelProcess] = field(default_factory=list, init=False)
    _tls_ports: dict[int, int] = field(default_factory=dict, init=False)

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` (or ``rediss+sentinel://``) URL of this topology, db 0."""
        scheme = "rediss+sentinel" if self.tls else "redis+sentinel"
        hosts = ",".join(f"127.0.0.1:{s.client_port}" for s in self.sentinel_processes)
        auth = f"{self.url_auth}@" if self.url_auth else ""
        query = f"?{self.url_options}" if self.url_options else ""
        return f"{scheme}://{auth}{hosts}/{self.master_name}/0{query}"

    def _server_args(self, base: Sequence[str]) -> tuple[str, ...]:
        args = [*FAST_REPLICATION, *self.extra_args, *base]
        for line in self.acl:
            args += ["--user", *line.split()]
        return tuple(args)

    def _start_server(self, replica_of: int | None) -> RedisServer:
        base: list[str] = []
        tls_port = 0
        if self.tls is not None:
            tls_port = free_port()
            base += _as_args(self.tls.server_settings(tls_port))
        if replica_of is not None:
            base += ["--replicaof", "127.0.0.1", str(replica_of)]
        server = RedisServer(extra_args=self._server_args(base)).start()
        self._tls_ports[server.port] = tls_port or server.port
        self.servers.append(server)
        return server

    def client_port(self, server: RedisServer) -> int:
        """The port sentinels report for ``server`` (its TLS port when TLS is on)."""
        return self._tls_ports.get(server.port, server.port)

    def start(self, timeout: float = 30.0) -> SentinelTopology:
        master = self._start_server(None)
        for _ in range(self.replicas):
            self._start_server(self.client_port(master))
        wait_for(lambda: self._online_replicas(master.port) == self.replicas, timeout)
        quorum = self.sentinels // 2 + 1
        for _ in range(self.sentinels):
            sentinel = SentinelProcess(
                self.master_name, self.client_port(master), quorum,
                down_after_ms=self.down_after_ms, failover_timeout_ms=self.failover_timeout_ms,
                tls=self.tls, extra_config=self.sentinel_acl,
            )
            self.sentinel_processes.append(sentinel)
            sentinel.start()
        # a failover needs the sentinels to know each other and the replicas (hello messages)
        wait_for(self._sentinels_agree, timeout, interval=0.1)
        return self

    @staticmethod
    def _online_replicas(port: int) -> int:
        info = _ask(port, "INFO", "replication")
        if not isinstance(info, dict):
            return 0
        return sum(
            1 for key, value in info.items()
            if key.startswith("slave") and isinstance(value, dict)
            and value.get("state") == "online"
        )

    def _sentinels_agree(self) -> bool:
        master_port = str(self.client_port(self.master()))
        for sentinel in self.sentinel_processes:
            state = sentinel.master_state()
            if (
                state.get("port") != master_port
                or "s_down" in state.get("flags", "")
                or int(state.get("num-other-sentinels", -1)) != self.sentinels - 1
                or int(state.get("num-slaves", -1)) < self.replicas
            ):
                return False
        return True

    def master_port(self) -> int | None:
        """The master's (client) port as the first answering sentinel reports it."""
        for sentinel in self.sentinel_processes:
            reply = _ask(sentinel.port, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name)
            if isinstance(reply, list) and len(reply) == 2:
                return int(reply[1])
        return None

    def master(self) -> RedisServer:
        """The data node the sentinels currently call master."""
        port = self.master_port()
        for server in self.servers:
            if self.client_port(server) == port:
                return server
        raise RedisUnavailable(f"no running server is the master (sentinels say port {port})")

    def kill_master(self) -> RedisServer:
        """SIGKILL the current master; return it (its process is dead, its port known)."""
        master = self.master()
        master.kill()
        return master

    def wait_for_failover(self, old_port: int, timeout: float = 30.0) -> RedisServer:
        """Wait until the sentinels name a new master (not the server on ``old_port``) that
        answers as a master; return it."""

        def promoted() -> bool:
            try:
                server = self.master()
            except RedisUnavailable:
                return False
            if server.port == old_port:
                return False
            info = _ask(server.port, "INFO", "replication")
            return isinstance(info, dict) and info.get("role") == "master"

        wait_for(promoted, timeout, interval=0.05)
        return self.master()

    def stop(self) -> None:
        # sentinels first, so that they do not start a failover while the servers go down
        for sentinel in self.sentinel_processes:
            sentinel.stop()
        for server in self.servers:
            server.stop()
        self.sentinel_processes.clear()
        self.servers.clear()

    def __enter__(self) -> SentinelTopology:
        super().__enter__()
        return self
