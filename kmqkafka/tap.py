"""``twistd kmqkafka``: Options and makeService, the only place the object graph is built.

Bad settings print one line to stderr and exit with status 2 before anything is opened.
"""
from __future__ import annotations

import fcntl
import os
import random
import sys
from pathlib import Path
from typing import Any, Callable

from prometheus_client import CollectorRegistry
from twisted.logger import Logger
from twisted.python import usage

from kmqkafka.config import ConfigError, Settings, load_settings, option_parameters
from kmqkafka.dispatch import Dispatcher
from kmqkafka.heap import keep_freed_memory, settle_heap
from kmqkafka.http import build_site
from kmqkafka.kafka import (
    acl, admin, api_versions, client_quotas, cluster, config_resources, configs, consumer_groups,
    fetch, groups, metadata, offsets, placement, positions, produce, producers, quorum, security,
    share_groups, share_offsets, transactions,
)
from kmqkafka.kafka.acl_store import StoredAcls
from kmqkafka.kafka.authz import Authorizer
from kmqkafka.kafka.context import Broker
from kmqkafka.kafka.scram_credentials import ScramCredentials
from kmqkafka.kafka import quotas
from kmqkafka.kafka.topics import TopicCatalog, connections_that_fit, partition_budget
from kmqkafka.metrics import Metrics
from kmqkafka.net.protocol import ConnectionLimiter, KafkaFactory
from kmqkafka.net.oauthbearer import Jwks
from kmqkafka.net.sasl import OAuthSettings, SaslUsers
from kmqkafka.service import BrokerService, Listener, exit_cleanly_on_sigterm, exit_with


class Options(usage.Options):
    """Every setting as an option (see ``kmqkafka.config.SETTINGS``); unset options defer to
    the environment, then the ``--config`` TOML file, then the defaults."""

    optFlags = [["kafka", None, "enable the Kafka connector [env CONNECTORS_KAFKA_ENABLE]"]]
    optParameters = [["config", "c", None, "TOML settings file (see etc/kmqkafka.toml)"]] + (
        option_parameters()
    )

    def parseOptions(self, options: Any = None) -> None:
        """A mistyped or incomplete option stops start-up like a bad setting: one line, exit
        status 2 (systemd's ``RestartPreventExitStatus``), not twistd's usage text and 1,
        which a unit would restart in a loop."""
        try:
            super().parseOptions(options)
        except usage.UsageError as e:
            sys.stderr.write(f"kmqkafka: {e} (twistd kmqkafka --help lists the options)\n")
            sys.stderr.flush()
            raise SystemExit(2) from None


log = Logger()

HANDLER_AREAS = (
    acl, api_versions, metadata, produce, fetch, positions, producers, admin, configs, cluster, groups,
    offsets, consumer_groups, quorum, placement, config_resources, transactions, share_groups,
    share_offsets, security, client_quotas,
)


def register_handlers(dispatcher: Dispatcher) -> None:
    """Register every Kafka API handler: each area module has ``register(dispatcher)``."""
    for area in HANDLER_AREAS:
        area.register(dispatcher)


def build_service(settings: Settings, reactor: Any, store: Any = None) -> BrokerService:
    """Wire settings, metrics, store, dispatcher and listeners into the top service.

    ``store`` defaults to a ``ChannelStore`` in ``settings.data_dir``. Raises ``ConfigError``
    for TLS material that cannot be loaded.
    """
    # TLS material is loaded before the store (whose Raft proposer starts a thread): a bad
    # certificate must end start-up with its one line, not leave a process that never exits.
    kafka_tls = None
    if settings.kafka_enable and settings.kafka_tls_enable:
        from kmqkafka.net.tls import server_context

        assert settings.tls_cert is not None and settings.tls_key is not None
        kafka_tls = server_context(
            settings.tls_cert, settings.tls_key,
            None if settings.tls_client_auth == "none" else settings.tls_ca,
            require_client_cert=settings.tls_client_auth == "required")
    oauth = oauth_settings(settings, reactor)
    registry = CollectorRegistry(auto_describe=True)
    metrics = Metrics(registry)
    if store is None:
        from kmqkafka.store.store import ChannelStore

        # Every node runs Raft; a lone node is a cluster of one (DESIGN.md), which writes its
        # appends through to the segments and keeps only their positions in the Raft log.
        factory = raft_proposer_factory(settings, reactor)
        store = ChannelStore(
            settings.data_dir, reactor, registry=registry, proposer_factory=factory,
            page_cache_bytes=settings.page_cache_bytes,
            retention_interval_s=settings.kafka_log_retention_check_interval_ms / 1000,
            compaction_interval_s=settings.kafka_log_cleaner_backoff_ms / 1000)
        from kmqkafka.raft.metrics import RaftCollector

        registry.register(RaftCollector(
            lambda: getattr(store, "proposer", None),
            settings.raft_tick_ms * settings.raft_election_ticks / 1000))
    broker = Broker(settings=settings, reactor=reactor, metrics=metrics, store=store)
    dispatcher = Dispatcher()
    broker.extras["dispatcher"] = dispatcher
    connections = connections_that_fit(settings.kafka_max_connections)
    broker.extras["topics"] = TopicCatalog(
        store, default_partitions=settings.kafka_num_partitions,
        max_partitions=partition_budget(connections), node_id=settings.node_id)
    broker.extras["topics"].on_deleted(lambda topic: metrics.forget_topic(topic.name))
    groups.install(broker)  # broker.extras["groups"]; loads its state on first use
    consumer_groups.install(broker)  # broker.extras["consumer_groups"] (KIP-848)
    transactions.install(broker)  # broker.extras["transactions"]; times out open ones
    share_groups.install(broker)  # broker.extras["share_groups"] (KIP-932)
    register_handlers(dispatcher)
    broker.extras["scram"] = ScramCredentials(store)  # AlterUserScramCredentials' store
    if settings.kafka_acl_enable:  # handlers check through ``kafka.authz``
        broker.extras["authorizer"] = Authorizer(StoredAcls(
            store, settings.kafka_super_users, settings.kafka_allow_everyone_if_no_acl_found))
    sasl_users = None
    if settings.kafka_enable and settings.kafka_sasl_mechanisms:
        sasl_users = SaslUsers(settings.kafka_sasl_mechanisms, settings.kafka_sasl_users,
                               stored=broker.extras["scram"], oauth=oauth,
                               max_reauth_ms=settings.kafka_connections_max_reauth_ms,
                               clock=reactor)
        broker.extras["sasl"] = sasl_users  # the forwarder authenticates its relays with it
    security.register_sasl(dispatcher, sasl_users)
    quotas.install(dispatcher, settings, reactor, client_quotas.install(broker))

    listeners: list[Listener] = []
    if settings.kafka_enable:
        limiter = ConnectionLimiter(connections)

        def factory(name: str) -> KafkaFactory:
            return KafkaFactory(dispatcher, metrics, reactor, settings.max_frame_bytes, limiter,
                                listener=name, broker=broker,
                                max_idle_s=settings.kafka_connections_max_idle_ms / 1000,
                                sasl_users=sasl_users)

        listeners.append(
            Listener("PLAINTEXT", settings.kafka_bind_host, settings.kafka_port, factory("PLAINTEXT"))
        )
        if kafka_tls is not None:
            listeners.append(
                Listener("SSL", settings.kafka_bind_host, settings.kafka_tls_port, factory("SSL"),
                         tls=kafka_tls)
            )
    service = BrokerService(reactor, store, None, listeners)
    service.http = Listener("HTTP", settings.http_host, settings.http_port,
                            build_site(registry, service.is_ready))
    service.broker = broker  # type: ignore[attr-defined]
    coordination = broker.extras["coordination"]
    service.release_parked = lambda: coordination.unload("shutting down")
    return service


def oauth_settings(settings: Settings, reactor: Any) -> OAuthSettings | None:
    """OAUTHBEARER's key set and expected claims, when that mechanism is on. A ``file://``
    JWKS is read now, so a bad one stops start-up with one line; the set is read again every
    refresh interval while the reactor runs."""
    if not (settings.kafka_enable and "OAUTHBEARER" in settings.kafka_sasl_mechanisms):
        return None
    if not settings.kafka_sasl_oauthbearer_jwks_url:
        log.warn("OAUTHBEARER has no JWKS (CONNECTORS_KAFKA_SASL_OAUTHBEARER_JWKS_URL): it "
                 "accepts unsigned tokens, as Kafka's default unsecured validator does; any "
                 "client can claim any principal. For development only.")
        return OAuthSettings(None)
    jwks = Jwks(settings.kafka_sasl_oauthbearer_jwks_url)
    if jwks.url.startswith("file://"):
        try:
            jwks.load_file()
        except ValueError as e:
            raise ConfigError(f"invalid setting CONNECTORS_KAFKA_SASL_OAUTHBEARER_JWKS_URL: "
                              f"{e}") from None
    reactor.callWhenRunning(jwks.start, reactor,
                            settings.kafka_sasl_oauthbearer_jwks_refresh_ms / 1000)
    reactor.addSystemEventTrigger("before", "shutdown", jwks.stop)
    audience = tuple(a.strip() for a in
                     settings.kafka_sasl_oauthbearer_expected_audience.split(",") if a.strip())
    return OAuthSettings(jwks, audience, settings.kafka_sasl_oauthbearer_expected_issuer)


def raft_proposer_factory(settings: Settings, reactor: Any) -> Callable[..., Any]:
    """The store's proposer: Raft, with this node as the only voter when no peers are set
    (the same code path as a cluster). Raft log writes get their own I/O thread."""
    from twisted.internet import threads
    from twisted.python.threadpool import ThreadPool

    from kmqkafka.raft.proposer import Member, RaftProposer
    from kmqkafka.raft.transport import RaftTransport

    rng = random.Random(os.urandom(16))
    node_id = settings.node_id if settings.peers else max(settings.node_id, 1)
    members = {p.node_id: Member(p.node_id, p.raft_host, p.raft_port, p.kafka_host, p.kafka_port,
                                 p.kafka_tls_port)
               for p in settings.peers}
    # Loaded now, before any thread starts, so bad material is a clean start-up error.
    server_tls, client_tls = _raft_tls(settings) if members else (None, None)

    def factory(machine: Any, clock: Any, run_io: Callable[..., Any]) -> RaftProposer:
        pool = ThreadPool(1, 1, "kmqkafka-raft")
        pool.start()
        reactor.addSystemEventTrigger("after", "shutdown", pool.stop)

        def run_raft_io(f: Callable[..., Any], *args: Any) -> Any:
            return threads.deferToThreadPool(reactor, pool, f, *args)

        transport = None
        if members:
            me = members[node_id]
            transport = RaftTransport(
                node_id, (settings.raft_bind_host or me.raft_host, me.raft_port),
                {m.node_id: (m.raft_host, m.raft_port) for m in members.values()},
                reactor, rng, run_io, tls_server=server_tls, tls_client=client_tls,
                serving=False)  # until the listeners open (``BrokerService``)
        return RaftProposer(
            machine, clock, run_io, node_id=node_id, members=members, transport=transport,
            raft_dir=settings.data_dir / "raft", rng=rng, run_raft_io=run_raft_io,
            tick_s=settings.raft_tick_ms / 1000, election_ticks=settings.raft_election_ticks,
            preallocate=settings.raft_preallocate)

    return factory


def _raft_tls(settings: Settings) -> tuple[Any, Any]:
    """(server, client) TLS contexts for the Raft port; (None, None) without a certificate."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None, None
    from twisted.internet import ssl

    from kmqkafka.net.tls import server_context

    # With a CA, a Raft peer must present a certificate it signed (raft/transport.py): an
    # anonymous TLS client must not reach the Raft port.
    server = server_context(settings.tls_cert, settings.tls_key, settings.tls_ca,
                            require_client_cert=settings.tls_ca is not None)
    cert_pem = settings.tls_cert.read_bytes()
    key_pem = cert_pem if settings.tls_key == settings.tls_cert else settings.tls_key.read_bytes()
    private = ssl.PrivateCertificate.loadPEM(cert_pem + b"\n" + key_pem)
    kwargs: dict[str, Any] = {}
    if settings.tls_ca is not None:
        ca_pem = settings.tls_ca.read_bytes()
        kwargs.update(verify=True, caCerts=[
            ssl.Certificate.loadPEM(b"-----BEGIN CERTIFICATE-----" + block).original
            for block in ca_pem.split(b"-----BEGIN CERTIFICATE-----")[1:]])
    client = ssl.CertificateOptions(privateKey=private.privateKey.original,
                                    certificate=private.original,
                                    raiseMinimumTo=ssl.TLSVersion.TLSv1_2, **kwargs)
    return server, client


def makeService(options: Options) -> BrokerService:
    """twistd entry point: validate settings (one line and exit 2 on error), then wire."""
    from twisted.internet import reactor

    keep_freed_memory()
    try:
        settings = load_settings(options, os.environ, options["config"])
    except ConfigError as e:
        sys.stderr.write(f"kmqkafka: {e}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None
    try:
        lock_data_dir(settings.data_dir)
    except DataDirUnusable as e:  # not a bad setting: it may pass (exit status 1)
        sys.stderr.write(f"kmqkafka: {e}\n")
        sys.stderr.flush()
        raise SystemExit(1) from None
    try:
        service = build_service(settings, reactor)
    except ConfigError as e:
        sys.stderr.write(f"kmqkafka: {e}\n")
        sys.stderr.flush()
        raise SystemExit(2) from None
    raise_open_file_limit()
    service.on_ready = settle_heap
    reactor.callWhenRunning(exit_cleanly_on_sigterm, reactor)
    reactor.addSystemEventTrigger("after", "shutdown", exit_with, service)
    return service


class DataDirUnusable(Exception):
    """The data directory cannot be made or locked (another process holds it)."""


_data_dir_lock: int | None = None


def lock_data_dir(data_dir: Path) -> None:
    """Hold an exclusive lock on ``{data_dir}/.lock`` for as long as this process lives, as
    Kafka's LogManager locks each log dir: two daemons on one store acknowledged the same
    offsets with different records, and a restart kept only one side. Raises
    ``DataDirUnusable`` when another process holds it (the kernel drops it when that one dies,
    ``kill -9`` included)."""
    global _data_dir_lock
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(data_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise DataDirUnusable(f"cannot use the data directory {data_dir} (KMQKAFKA_DATA_DIR): "
                              f"{e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise DataDirUnusable(f"the data directory {data_dir} (KMQKAFKA_DATA_DIR) is in use "
                              "by another kmqkafka process") from None
    _data_dir_lock = fd


def raise_open_file_limit() -> int:
    """Lift the soft open-file limit to the hard one: every partition keeps its active segment
    open and every client a socket, and a shell's usual soft limit (1024) is reached at about a
    thousand partitions. Returns the soft limit now in force."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        return soft
    return want
