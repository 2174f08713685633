"""Daemon settings: defaults < TOML file < environment < command-line options.

Every setting has one environment name (the seed's ``CONNECTORS_KAFKA_*`` names for the Kafka
connector, ``KMQKAFKA_*`` for the server), one ``twistd kmqkafka`` option and one TOML key
(``[kafka]`` or ``[server]`` table, lower-case name without the prefix). ``load_settings`` validates
everything up front; a bad value raises ``ConfigError`` whose message is a single line naming the
setting, which the tap prints before exiting non-zero.

``[security]`` is not interpreted here; it is handed through untouched in
``Settings.file_tables`` for the modules that own it. Any other table, and any key outside a
table, is refused like an unknown key (a misspelled ``[kafak]`` used to pass silently).
"""
from __future__ import annotations

import ipaddress
import re

import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping


class ConfigError(Exception):
    """A setting is invalid. ``str(error)`` is one line naming the setting."""


CLIENT_AUTH = ("required", "requested", "none")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}
_ALL_INTERFACES = {"", "0.0.0.0", "::", "[::]"}


@dataclass(frozen=True)
class Setting:
    """One setting: where it comes from and how its text is parsed."""

    attr: str
    env: str
    option: str
    table: str
    key: str
    kind: str  # bool|port|port0|size|posint|posint0|host|path|optpath|peers|clientauth|
    # mechanisms|users|jwks|text|principals
    default: Any
    help: str


SETTINGS: tuple[Setting, ...] = (
    Setting("kafka_enable", "CONNECTORS_KAFKA_ENABLE", "kafka", "kafka", "enable", "bool", False,
            "open the Kafka wire-protocol listeners"),
    Setting("kafka_port", "CONNECTORS_KAFKA_PORT", "kafka-port", "kafka", "port", "port", 9092,
            "plaintext Kafka listener port"),
    Setting("kafka_tls_port", "CONNECTORS_KAFKA_TLS_PORT", "kafka-tls-port", "kafka", "tls_port",
            "port", 9093, "TLS Kafka listener port"),
    Setting("kafka_tls_enable", "CONNECTORS_KAFKA_TLS_ENABLE", "kafka-tls-enable", "kafka",
            "tls_enable", "bool", None,
            "open the TLS Kafka listener (default: true when a TLS certificate is configured)"),
    Setting("kafka_advertised_host", "CONNECTORS_KAFKA_ADVERTISED_HOST", "kafka-advertised-host",
            "kafka", "advertised_host", "host", None,
            "host given to clients in Metadata (default: bind host, 127.0.0.1 when binding all)"),
    Setting("kafka_advertised_port", "CONNECTORS_KAFKA_ADVERTISED_PORT", "kafka-advertised-port",
            "kafka", "advertised_port", "port0", 0,
            "port given to clients in Metadata (0 = the listener's own port)"),
    Setting("kafka_max_connections", "CONNECTORS_KAFKA_MAX_CONNECTIONS", "kafka-max-connections",
            "kafka", "max_connections", "posint", 1000, "open Kafka connections allowed"),
    Setting("kafka_connections_max_idle_ms", "CONNECTORS_KAFKA_CONNECTIONS_MAX_IDLE_MS",
            "kafka-connections-max-idle-ms", "kafka", "connections_max_idle_ms", "posint",
            600000, "a Kafka connection idle this long (ms) is closed (Kafka's "
            "connections.max.idle.ms)"),
    Setting("kafka_max_message_bytes", "CONNECTORS_KAFKA_MAX_MESSAGE_BYTES",
            "kafka-max-message-bytes", "kafka", "max_message_bytes", "posint", 1048576,
            "largest record batch accepted"),
    Setting("kafka_max_groups", "CONNECTORS_KAFKA_MAX_GROUPS", "kafka-max-groups", "kafka",
            "max_groups", "posint", 10000, "consumer groups allowed"),
    Setting("kafka_offsets_retention_minutes", "CONNECTORS_KAFKA_OFFSETS_RETENTION_MINUTES",
            "kafka-offsets-retention-minutes", "kafka", "offsets_retention_minutes", "posint",
            10080, "committed offsets of a group left empty (or of topics it no longer reads) "
            "this long are deleted, then the empty group itself (Kafka's "
            "offsets.retention.minutes)"),
    Setting("kafka_offsets_retention_check_interval_ms",
            "CONNECTORS_KAFKA_OFFSETS_RETENTION_CHECK_INTERVAL_MS",
            "kafka-offsets-retention-check-interval-ms", "kafka",
            "offsets_retention_check_interval_ms", "posint", 600000,
            "how often (ms) expired offsets and empty groups are looked for (Kafka's "
            "offsets.retention.check.interval.ms)"),
    Setting("kafka_group_initial_rebalance_delay_ms",
            "CONNECTORS_KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS",
            "kafka-group-initial-rebalance-delay-ms", "kafka", "group_initial_rebalance_delay_ms",
            "posint0", 3000, "how long a new classic group waits for more members before its "
            "first rebalance (ms; Kafka's group.initial.rebalance.delay.ms)"),
    Setting("kafka_group_min_session_timeout_ms",
            "CONNECTORS_KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS", "kafka-group-min-session-timeout-ms",
            "kafka", "group_min_session_timeout_ms", "posint", 6000,
            "shortest session timeout a classic group member may ask for (ms; Kafka's "
            "group.min.session.timeout.ms)"),
    Setting("kafka_group_max_session_timeout_ms",
            "CONNECTORS_KAFKA_GROUP_MAX_SESSION_TIMEOUT_MS", "kafka-group-max-session-timeout-ms",
            "kafka", "group_max_session_timeout_ms", "posint", 1800000,
            "longest session timeout a classic group member may ask for (ms; Kafka's "
            "group.max.session.timeout.ms)"),
    Setting("kafka_consumer_session_timeout_ms", "CONNECTORS_KAFKA_CONSUMER_SESSION_TIMEOUT_MS",
            "kafka-consumer-session-timeout-ms", "kafka", "consumer_session_timeout_ms",
            "posint", 45000, "KIP-848 consumer group session timeout (ms)"),
    Setting("kafka_consumer_heartbeat_interval_ms",
            "CONNECTORS_KAFKA_CONSUMER_HEARTBEAT_INTERVAL_MS",
            "kafka-consumer-heartbeat-interval-ms", "kafka", "consumer_heartbeat_interval_ms",
            "posint", 5000, "KIP-848 consumer group heartbeat interval (ms)"),
    Setting("kafka_log_cleaner_backoff_ms", "CONNECTORS_KAFKA_LOG_CLEANER_BACKOFF_MS",
            "kafka-log-cleaner-backoff-ms", "kafka", "log_cleaner_backoff_ms", "posint", 15000,
            "pause between compaction passes over the compacted topics (ms; Kafka's "
            "log.cleaner.backoff.ms)"),
    Setting("kafka_log_retention_check_interval_ms",
            "CONNECTORS_KAFKA_LOG_RETENTION_CHECK_INTERVAL_MS",
            "kafka-log-retention-check-interval-ms", "kafka", "log_retention_check_interval_ms",
            "posint", 300000, "how often retention limits are enforced (ms; Kafka's "
            "log.retention.check.interval.ms, with its default)"),
    Setting("kafka_produce_byte_rate", "CONNECTORS_KAFKA_PRODUCE_BYTE_RATE",
            "kafka-produce-byte-rate", "kafka", "produce_byte_rate", "size", 0,
            "per-client produce quota in bytes/s (0 = unlimited)"),
    Setting("kafka_fetch_byte_rate", "CONNECTORS_KAFKA_FETCH_BYTE_RATE", "kafka-fetch-byte-rate",
            "kafka", "fetch_byte_rate", "size", 0,
            "per-client fetch quota in bytes/s (0 = unlimited)"),
    Setting("kafka_num_partitions", "CONNECTORS_KAFKA_NUM_PARTITIONS", "kafka-num-partitions",
            "kafka", "num_partitions", "partitions", 1,
            "partitions of an auto-created topic, and of CreateTopics without a count (Kafka's "
            "num.partitions; at most 256)"),
    Setting("kafka_auto_create_topics", "CONNECTORS_KAFKA_AUTO_CREATE_TOPICS",
            "kafka-auto-create-topics", "kafka", "auto_create_topics", "bool", True,
            "create unknown topics on Metadata/Produce"),
    Setting("kafka_bind_host", "CONNECTORS_KAFKA_BIND_HOST", "kafka-bind-host", "kafka",
            "bind_host", "host", "0.0.0.0", "interface the Kafka listeners bind"),
    Setting("kafka_sasl_mechanisms", "CONNECTORS_KAFKA_SASL_MECHANISMS",
            "kafka-sasl-mechanisms", "kafka", "sasl_mechanisms", "mechanisms", "",
            "SASL mechanisms clients must authenticate with, comma-separated: PLAIN, "
            "SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (empty = no SASL); when set, the "
            "plaintext listener is SASL_PLAINTEXT and the TLS listener SASL_SSL"),
    Setting("kafka_sasl_users", "CONNECTORS_KAFKA_SASL_USERS", "kafka-sasl-users", "kafka",
            "sasl_users", "users", "",
            "SASL users as name:password,... (in the TOML file also a table name = "
            "\"password\"); needed when sasl_mechanisms is set"),
    Setting("kafka_connections_max_reauth_ms", "CONNECTORS_KAFKA_CONNECTIONS_MAX_REAUTH_MS",
            "kafka-connections-max-reauth-ms", "kafka", "connections_max_reauth_ms", "posint0",
            0, "a SASL session lasts this long (ms), or until its OAUTHBEARER token expires; "
            "the client then authenticates again on its connection (KIP-368; Kafka's "
            "connections.max.reauth.ms; 0 = sessions never expire)"),
    Setting("kafka_sasl_oauthbearer_jwks_url", "CONNECTORS_KAFKA_SASL_OAUTHBEARER_JWKS_URL",
            "kafka-sasl-oauthbearer-jwks-url", "kafka", "sasl_oauthbearer_jwks_url", "jwks", "",
            "where OAUTHBEARER tokens' signing keys are published (a JWKS, file:// or "
            "http(s)://; Kafka's sasl.oauthbearer.jwks.endpoint.url); without one OAUTHBEARER "
            "takes unsigned tokens, as Kafka's default unsecured validator (development only)"),
    Setting("kafka_sasl_oauthbearer_jwks_refresh_ms",
            "CONNECTORS_KAFKA_SASL_OAUTHBEARER_JWKS_REFRESH_MS",
            "kafka-sasl-oauthbearer-jwks-refresh-ms", "kafka", "sasl_oauthbearer_jwks_refresh_ms",
            "posint", 3600000, "how often (ms) the JWKS is read again"),
    Setting("kafka_sasl_oauthbearer_expected_audience",
            "CONNECTORS_KAFKA_SASL_OAUTHBEARER_EXPECTED_AUDIENCE",
            "kafka-sasl-oauthbearer-expected-audience", "kafka",
            "sasl_oauthbearer_expected_audience", "text", "",
            "audiences a token must name one of, comma-separated (empty: not checked)"),
    Setting("kafka_sasl_oauthbearer_expected_issuer",
            "CONNECTORS_KAFKA_SASL_OAUTHBEARER_EXPECTED_ISSUER",
            "kafka-sasl-oauthbearer-expected-issuer", "kafka", "sasl_oauthbearer_expected_issuer",
            "text", "", "the issuer a token must name (empty: not checked)"),
    Setting("kafka_acl_enable", "CONNECTORS_KAFKA_ACL_ENABLE", "kafka-acl-enable", "kafka",
            "acl_enable", "bool", False,
            "authorize every request by the ACLs created through CreateAcls (Kafka's "
            "StandardAuthorizer); off = everyone may do everything and the ACL APIs answer "
            "SECURITY_DISABLED"),
    Setting("kafka_super_users", "CONNECTORS_KAFKA_SUPER_USERS", "kafka-super-users", "kafka",
            "super_users", "principals", "",
            "principals ACLs never restrict, semicolon-separated (User:admin;User:CN=ops), as "
            "Kafka's super.users"),
    Setting("kafka_allow_everyone_if_no_acl_found",
            "CONNECTORS_KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND",
            "kafka-allow-everyone-if-no-acl-found", "kafka", "allow_everyone_if_no_acl_found",
            "bool", False, "a resource no ACL names is open to everyone (Kafka's "
            "allow.everyone.if.no.acl.found); off = only super users may use it"),
    Setting("data_dir", "KMQKAFKA_DATA_DIR", "data-dir", "server", "data_dir", "path",
            "./kmq-data", "directory of the channel store"),
    Setting("page_cache_bytes", "KMQKAFKA_PAGE_CACHE_BYTES", "page-cache-bytes", "server",
            "page_cache_bytes", "size", 64 << 20,
            "bytes of the newest durable segment data kept in the OS page cache; older data "
            "is dropped from it so new writes reuse its pages (0 = leave it to the kernel)"),
    Setting("http_port", "KMQKAFKA_HTTP_PORT", "http-port", "server", "http_port", "port", 8080,
            "port of /metrics and /health"),
    Setting("http_host", "KMQKAFKA_HTTP_HOST", "http-host", "server", "http_host", "host",
            "0.0.0.0", "interface the metrics/health site binds"),
    Setting("tls_cert", "KMQKAFKA_TLS_CERT", "tls-cert", "server", "tls_cert", "optpath", None,
            "PEM certificate (chain) of the server"),
    Setting("tls_key", "KMQKAFKA_TLS_KEY", "tls-key", "server", "tls_key", "optpath", None,
            "PEM private key of the server (default: read from tls_cert)"),
    Setting("tls_ca", "KMQKAFKA_TLS_CA", "tls-ca", "server", "tls_ca", "optpath", None,
            "PEM CA bundle; when set, client certificates are requested and verified if sent"),
        Setting("tls_client_auth", "KMQKAFKA_TLS_CLIENT_AUTH", "tls-client-auth", "server",
            "tls_client_auth", "clientauth", "requested",
            "Kafka TLS listener client certificates, as Kafka's ssl.client.auth: required, "
            "requested (verified when presented) or none; required and requested need tls_ca"),
Setting("node_id", "KMQKAFKA_NODE_ID", "node-id", "server", "node_id", "posint0", 1,
            "this node's broker id"),
    Setting("peers", "KMQKAFKA_PEERS", "peers", "server", "peers", "peers", "",
            "Raft members, self included: "
            "id=raft_host:raft_port[/kafka_host:kafka_port[/tls_port]],... "
            "(empty = a cluster of one)"),
    Setting("raft_bind_host", "KMQKAFKA_RAFT_BIND_HOST", "raft-bind-host", "server",
            "raft_bind_host", "host", "", "interface the Raft port binds (default: own peer host)"),
    Setting("raft_tick_ms", "KMQKAFKA_RAFT_TICK_MS", "raft-tick-ms", "server", "raft_tick_ms",
            "posint", 100, "Raft tick interval in milliseconds"),
    Setting("raft_election_ticks", "KMQKAFKA_RAFT_ELECTION_TICKS", "raft-election-ticks",
            "server", "raft_election_ticks", "posint", 10,
            "Raft election timeout in ticks (randomized up to twice this)"),
    Setting("raft_preallocate", "KMQKAFKA_RAFT_PREALLOCATE", "raft-preallocate", "server",
            "raft_preallocate", "bool", True,
            "a new cluster member writes its Raft log's spare files (9 x 32 MiB of zeros) "
            "before it takes part, so its first writes reuse blocks and pages as later ones do"),
)


@dataclass(frozen=True)
class Peer:
    """One Raft member: where its Raft port is and the Kafka endpoint it advertises."""

    node_id: int
    raft_host: str
    raft_port: int
    kafka_host: str
    kafka_port: int
    kafka_tls_port: int | None = None  # None: the same TLS port as this node's


# The characters Kafka's listener parser takes in a host name (``SocketServerConfigs``' regex).
_HOST_NAME = re.compile(r"[0-9A-Za-z\-%._]+")


def host_problem(host: str) -> str | None:
    """Why ``host`` cannot be a host name or IP address (IPv6 bare or in brackets), or None."""
    inner = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if ":" in inner:
        try:
            ipaddress.IPv6Address(inner)
        except ValueError:
            return "is not a host name or IP address (an IPv6 address, or host without :port)"
        return None
    if inner is not host or not _HOST_NAME.fullmatch(inner):
        return "is not a host name or IP address"
    return None


def _host_port(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not host:port")
    problem = host_problem(host)
    if problem:
        raise ValueError(f"host {host!r} {problem}")
    return host.strip("[]"), _port(port)


def _port(text: str) -> int:
    if not _INTEGER.fullmatch(text.strip()):
        raise ValueError(f"port {text!r} is not a number")
    value = int(text)
    if not 1 <= value <= 65535:
        raise ValueError(f"port {value} is not in 1..65535")
    return value


def parse_peers(text: str, default_kafka_port: int) -> tuple[Peer, ...]:
    """Parse ``id=host:port[/kafka_host:kafka_port[/tls_port]],...``; raises ValueError (one
    line). ``tls_port`` is the node's TLS listener port, for nodes that do not share one
    (several on one host)."""
    peers: dict[int, Peer] = {}
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        ident, eq, rest = item.partition("=")
        if not eq:
            raise ValueError(f"{item!r} is not id=host:port")
        try:
            node_id = int(ident)
        except ValueError:
            raise ValueError(f"node id {ident!r} is not an integer") from None
        if node_id < 0:
            raise ValueError(f"node id {node_id} must not be negative")
        if node_id in peers:
            raise ValueError(f"node id {node_id} is listed twice")
        raft, slash, kafka = rest.partition("/")
        kafka, _, tls = kafka.partition("/")
        try:
            raft_host, raft_port = _host_port(raft)
            kafka_host, kafka_port = _host_port(kafka) if slash else (raft_host, default_kafka_port)
            tls_port = _port(tls) if tls else None
        except ValueError as e:
            raise ValueError(f"node {node_id}: {e}") from None
        peers[node_id] = Peer(node_id, raft_host, raft_port, kafka_host, kafka_port, tls_port)
    return tuple(peers[i] for i in sorted(peers))

_BY_ATTR = {s.attr: s for s in SETTINGS}


@dataclass(frozen=True)
class Settings:
    """Validated settings. Build with ``load_settings``; see ``SETTINGS`` for meanings."""

    kafka_enable: bool = False
    kafka_port: int = 9092
    kafka_tls_port: int = 9093
    kafka_tls_enable: bool = False
    kafka_advertised_host: str = "127.0.0.1"
    kafka_advertised_port: int = 9092
    kafka_max_connections: int = 1000
    kafka_connections_max_idle_ms: int = 600000
    kafka_max_message_bytes: int = 1048576
    kafka_max_groups: int = 10000
    kafka_offsets_retention_minutes: int = 10080
    kafka_offsets_retention_check_interval_ms: int = 600000
    kafka_group_initial_rebalance_delay_ms: int = 3000
    kafka_group_min_session_timeout_ms: int = 6000
    kafka_group_max_session_timeout_ms: int = 1800000
    kafka_consumer_session_timeout_ms: int = 45000
    kafka_consumer_heartbeat_interval_ms: int = 5000
    kafka_log_cleaner_backoff_ms: int = 15000
    kafka_log_retention_check_interval_ms: int = 300000
    kafka_produce_byte_rate: int = 0
    kafka_fetch_byte_rate: int = 0
    kafka_num_partitions: int = 1
    kafka_auto_create_topics: bool = True
    kafka_bind_host: str = "0.0.0.0"
    kafka_sasl_mechanisms: tuple[str, ...] = ()
    kafka_sasl_users: tuple[tuple[str, str], ...] = ()
    kafka_connections_max_reauth_ms: int = 0
    kafka_sasl_oauthbearer_jwks_url: str = ""
    kafka_sasl_oauthbearer_jwks_refresh_ms: int = 3600000
    kafka_sasl_oauthbearer_expected_audience: str = ""
    kafka_sasl_oauthbearer_expected_issuer: str = ""
    kafka_acl_enable: bool = False
    kafka_super_users: tuple[str, ...] = ()
    kafka_allow_everyone_if_no_acl_found: bool = False
    data_dir: Path = Path("./kmq-data")
    page_cache_bytes: int = 64 << 20
    http_port: int = 8080
    http_host: str = "0.0.0.0"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    tls_client_auth: str = "requested"
    node_id: int = 1
    peers: tuple[Peer, ...] = ()
    raft_bind_host: str = ""
    raft_tick_ms: int = 100
    raft_election_ticks: int = 10
    raft_preallocate: bool = True
    config_file: Path | None = None
    file_tables: Mapping[str, Any] = field(default_factory=dict)

    @property
    def max_frame_bytes(self) -> int:
        """Largest request frame a Kafka connection accepts (record batches plus headroom)."""
        return max(100 * 1024 * 1024, 2 * self.kafka_max_message_bytes)


def _name(s: Setting) -> str:
    return f"{s.env} (--{s.option}, [{s.table}] {s.key})"


_INTEGER = re.compile(r"[+-]?[0-9]+")
_JAVA_INT_MAX = 2**31 - 1
MAX_TOPIC_PARTITIONS = 256
"""Most partitions a topic may have (the seed's cap; CreateTopics, CreatePartitions)."""


def _parse(s: Setting, raw: Any) -> Any:
    """Turn ``raw`` (text from env/options, or a TOML value) into the setting's type."""
    def bad(why: str) -> ConfigError:
        return ConfigError(f"invalid setting {_name(s)}: {raw!r} {why}")

    if s.kind == "bool":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
        raise bad("is not a boolean (use true/false, yes/no, on/off, 1/0)")
    if s.kind in ("port", "port0", "size", "posint", "posint0", "partitions"):
        if isinstance(raw, bool):
            raise bad("is not an integer")
        if isinstance(raw, int):
            value = raw
        else:
            text = str(raw).strip()
            if not _INTEGER.fullmatch(text):  # int() would also take "9_092" or " ９"
                raise bad("is not an integer")
            value = int(text, 10)
        if s.kind != "size" and value > _JAVA_INT_MAX:
            raise bad(f"is larger than {_JAVA_INT_MAX} (a Java int, as in Kafka)")
        if s.kind == "port" and not 1 <= value <= 65535:
            raise bad("is not a port number in 1..65535")
        if s.kind == "port0" and not 0 <= value <= 65535:
            raise bad("is not a port number in 0..65535")
        if s.kind in ("size", "posint0") and value < 0:
            raise bad("must not be negative")
        if s.kind == "posint" and value < 1:
            raise bad("must be a positive integer")
        if s.kind == "partitions" and not 1 <= value <= MAX_TOPIC_PARTITIONS:
            raise bad(f"is not a partition count in 1..{MAX_TOPIC_PARTITIONS}")
        return value
    if s.kind == "mechanisms":
        return _mechanisms(raw, bad)
    if s.kind == "principals":
        return _principals(raw, bad)
    if s.kind == "users":  # never echo the value: it holds passwords
        return _users(raw, lambda why: ConfigError(f"invalid setting {_name(s)}: {why}"))
    if not isinstance(raw, str):
        raise bad("is not a string")
    if s.kind in ("peers", "text"):
        return raw.strip()
    if s.kind == "jwks":
        text = raw.strip()
        if text and not text.startswith(("file://", "http://", "https://")):
            raise bad("is not a file://, http:// or https:// URL")
        return text
    if s.kind == "clientauth":
        text = raw.strip().lower()
        if text not in CLIENT_AUTH:
            raise bad(f"is not one of {', '.join(CLIENT_AUTH)}")
        return text
    if s.kind == "host":
        text = raw.strip()
        problem = text and host_problem(text)
        if problem:
            raise bad(problem)
        return text
    text = raw.strip()
    if s.kind == "optpath" and text == "":
        return None
    if text == "":
        raise bad("is empty")
    return Path(text)


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


def _mechanisms(raw: Any, bad: Any) -> tuple[str, ...]:
    """Comma-separated text (or a TOML list) of SASL mechanism names, in the order given."""
    items = raw if isinstance(raw, list) else str(raw).split(",")
    names: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise bad("is not a list of mechanism names")
        name = item.strip().upper()
        if not name:
            continue
        if name not in SASL_MECHANISMS:
            raise bad(f"names {item.strip()!r}, not one of {', '.join(SASL_MECHANISMS)}")
        if name not in names:
            names.append(name)
    return tuple(names)


def _principals(raw: Any, bad: Any) -> tuple[str, ...]:
    """``Type:name;Type:name`` text (semicolons, since a certificate's name has commas), or a
    TOML list."""
    items = raw if isinstance(raw, list) else str(raw).split(";")
    out: list[str] = []
    for item in items:
        if not isinstance(item, str):
            raise bad("is not a list of principals")
        text = item.strip()
        if not text:
            continue
        kind, colon, name = text.partition(":")
        if not colon or not kind.strip() or not name.strip():
            raise bad(f"names {text!r}, not a principal Type:name (User:alice)")
        out.append(f"{kind.strip()}:{name.strip()}")
    return tuple(out)


def _users(raw: Any, bad: Any) -> tuple[tuple[str, str], ...]:
    """``name:password,...`` text, or a TOML table ``name = "password"``."""
    if isinstance(raw, dict):
        pairs = list(raw.items())
    elif isinstance(raw, str):
        pairs = []
        for item in raw.split(","):
            if not item.strip():
                continue
            name, colon, password = item.partition(":")
            if not colon:
                raise bad(f"entry {item.partition(':')[0].strip()!r} is not name:password")
            pairs.append((name.strip(), password))
    else:
        raise bad("is not name:password,... or a table of passwords")
    seen: set[str] = set()
    for name, password in pairs:
        if not isinstance(password, str) or not password:
            raise bad(f"gives user {name!r} no password")
        if not name:
            raise bad("has a user without a name")
        if name in seen:
            raise bad(f"names user {name!r} twice")
        seen.add(name)
    return tuple(pairs)


def _read_file(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"invalid setting --config: cannot read {str(path)!r}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"invalid setting --config: {str(path)!r} is not valid TOML: {str(e).splitlines()[0]}"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"invalid setting --config: {str(path)!r} is not valid TOML: it is not UTF-8"
        ) from None


PASSED_TABLES = frozenset({"security"})
"""TOML tables besides [kafka] and [server] that are handed on (``Settings.file_tables``)."""


def _file_values(path: Path, data: Mapping[str, Any]) -> dict[str, Any]:
    known = {(s.table, s.key): s for s in SETTINGS}
    values: dict[str, Any] = {}
    for name, value in data.items():
        if name in ("kafka", "server") or (name in PASSED_TABLES and isinstance(value, dict)):
            continue
        what = f"table [{name}]" if isinstance(value, dict) else f"key {name} outside a table"
        raise ConfigError(f"invalid setting --config: unknown {what} in {str(path)!r}")
    for table in ("kafka", "server"):
        section = data.get(table, {})
        if not isinstance(section, dict):
            raise ConfigError(f"invalid setting --config: [{table}] in {str(path)!r} is not a table")
        for key, value in section.items():
            s = known.get((table, key))
            if s is None:
                raise ConfigError(
                    f"invalid setting --config: unknown key [{table}] {key} in {str(path)!r}"
                )
            values[s.attr] = value
    return values


def _own_endpoint_defaults(values: dict[str, Any], given: set[str]) -> None:
    """A cluster node's own ``--peers`` entry supplies the Kafka settings it leaves unset.

    The other nodes advertise this node at the Kafka address its peer entry names, so by
    default it listens and advertises itself there too; and when that address is a loopback
    IP (several nodes on one host as 127.0.0.1, 127.0.0.2, ...) the Kafka and HTTP listeners
    bind that IP, so the nodes can share port numbers."""
    text = values.get("peers") or ""
    if not text:
        return
    try:
        peers = parse_peers(text, values["kafka_advertised_port"] or values["kafka_port"])
    except ValueError:
        return  # reported with the setting's name below
    own = next((p for p in peers if p.node_id == values["node_id"]), None)
    if own is None:
        return
    if "kafka_port" not in given:
        values["kafka_port"] = own.kafka_port
    if "kafka_advertised_host" not in given:
        values["kafka_advertised_host"] = own.kafka_host
    if "kafka_advertised_port" not in given:
        values["kafka_advertised_port"] = own.kafka_port
    if own.kafka_tls_port is not None and "kafka_tls_port" not in given:
        values["kafka_tls_port"] = own.kafka_tls_port
    if _is_loopback_ip(own.kafka_host):
        if "kafka_bind_host" not in given:
            values["kafka_bind_host"] = own.kafka_host
        if "http_host" not in given:
            values["http_host"] = own.kafka_host


def _is_loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_settings(
    options: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    config_file: str | Path | None = None,
) -> Settings:
    """Merge and validate settings.

    ``options`` maps option names (``"kafka-port"``) to their text, ``None`` meaning not given;
    the ``kafka`` flag is a bool (only ``True`` overrides). ``environ`` is the process
    environment (pass ``os.environ``). Raises ``ConfigError`` (one line) on any bad value.
    """
    options = options or {}
    environ = environ or {}
    file_path = Path(config_file) if config_file else None
    file_data: dict[str, Any] = _read_file(file_path) if file_path else {}
    from_file = _file_values(file_path, file_data) if file_path else {}

    values: dict[str, Any] = {}
    given: set[str] = set()
    for s in SETTINGS:
        opt = options.get(s.option)
        if s.kind == "bool" and s.option == "kafka":
            opt = True if opt else None  # a flag can only switch on
        # Every source that gives the setting is validated, not only the one that wins: a typo
        # in the file must not lie in wait behind an environment variable.
        sources = (opt, environ.get(s.env), from_file.get(s.attr))
        parsed = [_parse(s, raw) for raw in sources if raw is not None]
        if parsed:
            values[s.attr] = parsed[0]
            given.add(s.attr)
        else:
            values[s.attr] = (Path(s.default) if s.kind == "path" else
                              _parse(s, s.default) if s.kind in ("mechanisms", "users") else
                              s.default)

    if values["tls_key"] is None and values["tls_cert"] is not None:
        values["tls_key"] = values["tls_cert"]
    if values["kafka_tls_enable"] is None:
        values["kafka_tls_enable"] = values["tls_cert"] is not None
    if values["kafka_enable"] and values["kafka_tls_enable"] and values["tls_cert"] is None:
        raise ConfigError(
            f"invalid setting {_name(_BY_ATTR['kafka_tls_enable'])}: TLS is enabled but no "
            f"certificate is configured (set KMQKAFKA_TLS_CERT and KMQKAFKA_TLS_KEY)"
        )
    if values["tls_client_auth"] == "required" and values["tls_ca"] is None:
        raise ConfigError(
            f"invalid setting {_name(_BY_ATTR['tls_client_auth'])}: 'required' needs the CA "
            f"that signs client certificates (KMQKAFKA_TLS_CA)"
        )
    if values["kafka_enable"] and values["kafka_port"] == values["kafka_tls_port"] and values[
        "kafka_tls_enable"
    ]:
        raise ConfigError(
            f"invalid setting {_name(_BY_ATTR['kafka_tls_port'])}: same as the plaintext port"
        )
    _own_endpoint_defaults(values, given)
    if values["kafka_advertised_host"] in (None, ""):
        bind = values["kafka_bind_host"]
        values["kafka_advertised_host"] = "127.0.0.1" if bind in _ALL_INTERFACES else bind
    if values["kafka_advertised_port"] == 0:
        values["kafka_advertised_port"] = values["kafka_port"]

    peers_setting = _BY_ATTR["peers"]
    try:
        values["peers"] = parse_peers(values["peers"] or "", values["kafka_advertised_port"])
    except ValueError as e:
        raise ConfigError(f"invalid setting {_name(peers_setting)}: {e}") from None
    if values["peers"]:
        ids = [p.node_id for p in values["peers"]]
        if values["node_id"] not in ids:
            raise ConfigError(
                f"invalid setting {_name(peers_setting)}: this node's id {values['node_id']} "
                f"(KMQKAFKA_NODE_ID) is not among the peers {ids}"
            )
    if values["kafka_group_min_session_timeout_ms"] > values["kafka_group_max_session_timeout_ms"]:
        raise ConfigError(
            f"invalid setting {_name(_BY_ATTR['kafka_group_min_session_timeout_ms'])}: larger "
            f"than the maximum ({values['kafka_group_max_session_timeout_ms']} ms)"
        )
    mechanisms = values["kafka_sasl_mechanisms"]
    with_users = [m for m in mechanisms if m != "OAUTHBEARER"]
    if (with_users or (mechanisms and values["peers"])) and not values["kafka_sasl_users"]:
        raise ConfigError(
            f"invalid setting {_name(_BY_ATTR['kafka_sasl_users'])}: "
            + (f"SASL {', '.join(with_users)} is enabled (CONNECTORS_KAFKA_SASL_MECHANISMS) "
               f"but no user is configured" if with_users else
               "a cluster's nodes relay requests to the leader as a configured user, by "
               "PLAIN or SCRAM; configure one and enable one of those mechanisms"))
    if mechanisms and values["peers"] and not with_users:
        raise ConfigError(
            f"invalid setting {_name(_BY_ATTR['kafka_sasl_mechanisms'])}: a cluster's nodes "
            f"relay requests to the leader by PLAIN or SCRAM; enable one of them too")
    if values["raft_election_ticks"] < 2:
        raise ConfigError(
            f"invalid setting {_name(_BY_ATTR['raft_election_ticks'])}: must be at least 2"
        )

    extra = {k: v for k, v in file_data.items() if k not in ("kafka", "server")}
    return Settings(**values, config_file=file_path, file_tables=extra)


def option_parameters() -> list[list[Any]]:
    """``usage.Options.optParameters`` rows for every non-flag setting (defaults are None)."""
    rows: list[list[Any]] = []
    for s in SETTINGS:
        if s.option == "kafka":
            continue
        rows.append([s.option, None, None, f"{s.help} [env {s.env}; default {s.default!r}]"])
    return rows

