"""Settings: precedence option > environment > TOML file > default, and one-line errors."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kmqkafka.config import SETTINGS, ConfigError, Settings, load_settings
from kmqkafka.tap import Options

from conftest import TWISTD, base_env, free_port

REPO = Path(__file__).resolve().parent.parent


def options(*argv: str) -> Options:
    opts = Options()
    opts.parseOptions(list(argv))
    return opts


def test_defaults_match_the_seed() -> None:
    s = load_settings({}, {})
    assert (s.kafka_enable, s.kafka_port, s.kafka_tls_port) == (False, 9092, 9093)
    assert s.kafka_advertised_port == 9092 and s.kafka_advertised_host == "127.0.0.1"
    assert (s.kafka_max_connections, s.kafka_max_message_bytes, s.kafka_max_groups) == (
        1000, 1048576, 10000)
    assert (s.kafka_produce_byte_rate, s.kafka_fetch_byte_rate) == (0, 0)
    assert s.kafka_auto_create_topics is True and s.kafka_tls_enable is False
    assert s.data_dir == Path("./kmq-data") and s.http_port == 8080 and s.node_id == 1


def test_precedence_option_over_env_over_file_over_default(tmp_path: Path) -> None:
    f = tmp_path / "k.toml"
    f.write_text("[kafka]\nport = 1001\nmax_groups = 7\nmax_connections = 5\n")
    env = {"CONNECTORS_KAFKA_PORT": "2002", "CONNECTORS_KAFKA_MAX_GROUPS": "8"}
    s = load_settings(options("--kafka-port", "3003"), env, f)
    assert s.kafka_port == 3003  # option wins
    assert s.kafka_max_groups == 8  # env beats file
    assert s.kafka_max_connections == 5  # file beats default
    assert s.kafka_max_message_bytes == 1048576  # default


def test_kafka_flag_and_env_enable() -> None:
    assert load_settings(options("--kafka"), {}).kafka_enable is True
    assert load_settings(options(), {"CONNECTORS_KAFKA_ENABLE": "yes"}).kafka_enable is True
    assert load_settings(options(), {"CONNECTORS_KAFKA_ENABLE": "off"}).kafka_enable is False


def test_advertised_defaults_follow_bind_host_and_port() -> None:
    s = load_settings({}, {"CONNECTORS_KAFKA_BIND_HOST": "10.1.2.3", "CONNECTORS_KAFKA_PORT": "9000"})
    assert (s.kafka_advertised_host, s.kafka_advertised_port) == ("10.1.2.3", 9000)
    s = load_settings({}, {"CONNECTORS_KAFKA_ADVERTISED_HOST": "b.example",
                           "CONNECTORS_KAFKA_ADVERTISED_PORT": "19092"})
    assert (s.kafka_advertised_host, s.kafka_advertised_port) == ("b.example", 19092)


def test_tls_enable_defaults_to_certificate_presence() -> None:
    s = load_settings({}, {"KMQKAFKA_TLS_CERT": "/x/c.pem"})
    assert s.kafka_tls_enable is True and s.tls_key == Path("/x/c.pem")
    s = load_settings({}, {"KMQKAFKA_TLS_CERT": "/x/c.pem", "CONNECTORS_KAFKA_TLS_ENABLE": "false"})
    assert s.kafka_tls_enable is False


def test_tls_enabled_without_certificate_is_an_error() -> None:
    with pytest.raises(ConfigError, match="CONNECTORS_KAFKA_TLS_ENABLE.*no certificate"):
        load_settings({}, {"CONNECTORS_KAFKA_ENABLE": "1", "CONNECTORS_KAFKA_TLS_ENABLE": "1"})


BAD_VALUES = [
    ("CONNECTORS_KAFKA_ENABLE", "maybe"),
    ("CONNECTORS_KAFKA_PORT", "abc"),
    ("CONNECTORS_KAFKA_PORT", "0"),
    ("CONNECTORS_KAFKA_PORT", "65536"),
    ("CONNECTORS_KAFKA_TLS_PORT", "-1"),
    ("CONNECTORS_KAFKA_ADVERTISED_PORT", "70000"),
    ("CONNECTORS_KAFKA_MAX_CONNECTIONS", "0"),
    ("CONNECTORS_KAFKA_MAX_MESSAGE_BYTES", "-5"),
    ("CONNECTORS_KAFKA_MAX_GROUPS", "1.5"),
    ("CONNECTORS_KAFKA_PRODUCE_BYTE_RATE", "-1"),
    ("CONNECTORS_KAFKA_FETCH_BYTE_RATE", "lots"),
    ("CONNECTORS_KAFKA_AUTO_CREATE_TOPICS", "perhaps"),
    ("CONNECTORS_KAFKA_NUM_PARTITIONS", "0"),
    ("CONNECTORS_KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS", "0"),
    ("CONNECTORS_KAFKA_NUM_PARTITIONS", "257"),                # past a topic's partition cap
    ("CONNECTORS_KAFKA_TLS_ENABLE", "2"),
    ("KMQKAFKA_HTTP_PORT", "http"),
    ("KMQKAFKA_NODE_ID", "-1"),
    ("KMQKAFKA_DATA_DIR", " "),
    ("CONNECTORS_KAFKA_PORT", "9_092"),                     # Python's int() takes it
    ("CONNECTORS_KAFKA_MAX_MESSAGE_BYTES", "4294967296"),   # past a Java int, as in Kafka
    ("CONNECTORS_KAFKA_MAX_CONNECTIONS", "1" + "0" * 20),
    ("CONNECTORS_KAFKA_ADVERTISED_HOST", "bad host"),        # clients could never reach it
    ("CONNECTORS_KAFKA_ADVERTISED_HOST", "kafka:9092"),      # Kafka's own parser takes it as
    ("CONNECTORS_KAFKA_BIND_HOST", "host/8"),                # an IPv6 address only in [...]
    ("KMQKAFKA_HTTP_HOST", "[::1"),
    ("KMQKAFKA_PEERS", "1=bad host:19001"),
    ("KMQKAFKA_PEERS", "1=127.0.0.1:19001/127.0.0.1:9092/tls"),
    ("KMQKAFKA_PEERS", "1=127.0.0.1:19001/127.0.0.1:9092/70000"),
    ("KMQKAFKA_PEERS", "-1=127.0.0.1:19001"),
    ("CONNECTORS_KAFKA_SUPER_USERS", "admin"),
    ("CONNECTORS_KAFKA_SUPER_USERS", "User:admin;Group:"),
    ("CONNECTORS_KAFKA_ACL_ENABLE", "maybe"),
]


@pytest.mark.parametrize("name,value", [
    ("CONNECTORS_KAFKA_ADVERTISED_HOST", "broker-1.example.com"),
    ("CONNECTORS_KAFKA_ADVERTISED_HOST", "::1"),
    ("CONNECTORS_KAFKA_BIND_HOST", "[::]"),
    ("CONNECTORS_KAFKA_BIND_HOST", ""),
    ("KMQKAFKA_PEERS", "1=[::1]:19001/[::1]:9092"),
    ("KMQKAFKA_PEERS", "1=127.0.0.1:19001/127.0.0.1:9092/9093"),
])
def test_host_names_and_addresses_are_accepted(name: str, value: str) -> None:
    load_settings({}, {name: value})


def test_super_users_are_semicolon_separated_principals_or_a_list(tmp_path: Path) -> None:
    s = load_settings({}, {"CONNECTORS_KAFKA_SUPER_USERS": " User:admin ; User:CN=ops,O=acme;"})
    assert s.kafka_super_users == ("User:admin", "User:CN=ops,O=acme")
    f = tmp_path / "k.toml"
    f.write_text('[kafka]\nsuper_users = ["User:root"]\nacl_enable = true\n')
    s = load_settings({}, {}, f)
    assert s.kafka_super_users == ("User:root",) and s.kafka_acl_enable


def test_group_session_timeout_minimum_above_maximum_is_one_line() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({}, {"CONNECTORS_KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS": "9000",
                           "CONNECTORS_KAFKA_GROUP_MAX_SESSION_TIMEOUT_MS": "8000"})
    assert "CONNECTORS_KAFKA_GROUP_MIN_SESSION_TIMEOUT_MS" in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name,value", BAD_VALUES)
def test_bad_value_is_one_line_naming_the_setting(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({}, {name: value})
    message = str(info.value)
    assert "\n" not in message and name in message


def test_bad_value_in_file_and_option_names_the_setting(tmp_path: Path) -> None:
    f = tmp_path / "k.toml"
    f.write_text('[kafka]\nport = "nine"\n')
    with pytest.raises(ConfigError, match="CONNECTORS_KAFKA_PORT"):
        load_settings({}, {}, f)
    f.write_text("[kafka]\nmax_groups = true\n")
    with pytest.raises(ConfigError, match="CONNECTORS_KAFKA_MAX_GROUPS"):
        load_settings({}, {}, f)
    with pytest.raises(ConfigError, match="CONNECTORS_KAFKA_MAX_CONNECTIONS"):
        load_settings(options("--kafka-max-connections", "x"), {})


@pytest.mark.parametrize("content,needle", [
    ("[kafka\nport = 1", "not valid TOML"),
    ("[kafka]\nprot = 1\n", "unknown key [kafka] prot"),
    ("kafka = 3\n", "not a table"),
    ("[kafak]\nport = 1\n", "unknown table [kafak]"),
    ("[Server]\nhttp_port = 1\n", "unknown table [Server]"),
    ("port = 9092\n[kafka]\n", "unknown key port outside a table"),
    ("# caf\xe9\n[kafka]\n", "not UTF-8"),
])
def test_bad_file_is_one_line(tmp_path: Path, content: str, needle: str) -> None:
    f = tmp_path / "k.toml"
    f.write_bytes(content.encode("latin-1"))
    with pytest.raises(ConfigError) as info:
        load_settings({}, {}, f)
    assert "\n" not in str(info.value) and needle in str(info.value)
    assert "--config" in str(info.value)


def test_unreadable_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config: cannot read") as info:
        load_settings({}, {}, tmp_path / "missing.toml")
    assert "\n" not in str(info.value)


def test_other_tables_are_passed_through(tmp_path: Path) -> None:
    f = tmp_path / "k.toml"
    f.write_text('[security]\nsasl = ["PLAIN"]\n')
    assert load_settings({}, {}, f).file_tables == {"security": {"sasl": ["PLAIN"]}}


def test_shipped_example_file_is_valid_and_documents_every_setting() -> None:
    path = REPO / "etc" / "kmqkafka.toml"
    s = load_settings({}, {}, path)
    assert s == Settings(config_file=path, kafka_advertised_port=9092)
    text = path.read_text()
    for setting in SETTINGS:
        assert setting.env in text and setting.key in text, setting.env


def test_every_setting_is_an_option() -> None:
    opts = Options()
    names = {p[0] for p in opts.optParameters} | {f[0] for f in opts.optFlags}
    assert {s.option for s in SETTINGS} <= names


@pytest.mark.parametrize("name,value", [("CONNECTORS_KAFKA_PORT", "notaport"),
                                        ("CONNECTORS_KAFKA_ENABLE", "sometimes")])
def test_twistd_exits_nonzero_with_the_one_line(tmp_path: Path, name: str, value: str) -> None:
    env = base_env()
    env.update({name: value, "KMQKAFKA_HTTP_PORT": str(free_port()),
                "KMQKAFKA_HTTP_HOST": "127.0.0.1", "KMQKAFKA_DATA_DIR": str(tmp_path / "d")})
    proc = subprocess.run([str(TWISTD), "-n", "--pidfile=", "kmqkafka"], cwd=tmp_path, env=env,
                          capture_output=True, timeout=60)
    assert proc.returncode != 0
    lines = [l for l in (proc.stdout + proc.stderr).decode().splitlines() if l.strip()]
    assert len(lines) == 1, lines
    assert name in lines[0] and value in lines[0]
    assert not (tmp_path / "d").exists(), "nothing may be opened before settings are valid"


@pytest.mark.parametrize("args,needle", [(["--kafka-prot", "9092"], "--kafka-prot"),
                                         (["--kafka-port"], "--kafka-port"),
                                         (["stray"], "arguments")])
def test_a_bad_option_is_one_line_and_exit_status_2(tmp_path: Path, args: list,
                                                     needle: str) -> None:
    """Not twistd's 200 lines of usage and status 1, which a systemd unit would restart in a
    loop: a mistyped option is a bad setting like any other."""
    env = base_env()
    env.update({"KMQKAFKA_DATA_DIR": str(tmp_path / "d")})
    proc = subprocess.run([str(TWISTD), "-n", "--pidfile=", "kmqkafka", *args], cwd=tmp_path,
                          env=env, capture_output=True, timeout=60)
    lines = [l for l in (proc.stdout + proc.stderr).decode().splitlines() if l.strip()]
    assert proc.returncode == 2, lines
    assert len(lines) == 1 and needle in lines[0], lines


@pytest.mark.parametrize("taken", ["KMQKAFKA_HTTP_PORT", "CONNECTORS_KAFKA_PORT"])
def test_a_taken_port_stops_start_up_with_exit_status_1(tmp_path: Path, taken: str) -> None:
    """A second daemon on a busy port must exit (systemd restarts it), not run on deaf."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    ports = {"KMQKAFKA_HTTP_PORT": str(free_port()), "CONNECTORS_KAFKA_PORT": str(free_port())}
    ports[taken] = str(holder.getsockname()[1])
    env = base_env()
    env.update({**ports, "KMQKAFKA_HTTP_HOST": "127.0.0.1", "CONNECTORS_KAFKA_ENABLE": "true",
                "CONNECTORS_KAFKA_BIND_HOST": "127.0.0.1",
                "KMQKAFKA_DATA_DIR": str(tmp_path / "d")})
    try:
        proc = subprocess.run([str(TWISTD), "-n", "--pidfile=", "kmqkafka"], cwd=tmp_path,
                              env=env, capture_output=True, timeout=60)
    finally:
        holder.close()
    out = (proc.stdout + proc.stderr).decode()
    assert proc.returncode == 1, out
    assert f"could not start: Couldn't listen on 127.0.0.1:{ports[taken]}" in out


def test_a_peer_entry_may_name_its_tls_port_and_its_own_sets_the_listener() -> None:
    s = load_settings({}, {"KMQKAFKA_NODE_ID": "2", "KMQKAFKA_PEERS":
                           "1=127.0.0.1:19001/127.0.0.1:9092/9093,"
                           "2=127.0.0.1:19002/127.0.0.1:9192/9193"})
    assert [p.kafka_tls_port for p in s.peers] == [9093, 9193]
    assert (s.kafka_port, s.kafka_tls_port) == (9192, 9193)


def test_the_shipped_file_leaves_a_node_its_own_peer_entry() -> None:
    """systemd starts every node with etc/kmqkafka.toml: its documented defaults must not
    count as given, or a node listens on 9092 while the others advertise it at 9192."""
    s = load_settings({}, {"KMQKAFKA_NODE_ID": "2", "KMQKAFKA_PEERS":
                           "1=127.0.0.2:19001/127.0.0.2:9092,2=127.0.0.3:19002/127.0.0.3:9192"},
                      REPO / "etc" / "kmqkafka.toml")
    assert (s.kafka_port, s.kafka_advertised_port) == (9192, 9192)
    assert s.kafka_advertised_host == "127.0.0.3" == s.kafka_bind_host


def test_node_ids_start_at_0_as_kafka_broker_ids_do() -> None:
    s = load_settings({}, {"KMQKAFKA_NODE_ID": "0", "KMQKAFKA_PEERS":
                           "0=127.0.0.1:19001/127.0.0.1:9092,1=127.0.0.1:19002/127.0.0.1:9093"})
    assert s.node_id == 0 and [p.node_id for p in s.peers] == [0, 1]


def test_a_second_daemon_on_the_same_data_dir_stops_with_one_line(tmp_path: Path) -> None:
    """As Kafka's log-dir lock: two daemons on one store acknowledged the same offsets with
    different records. The second exits 1 (the first may be on its way out), the first
    serves on, and a kill -9 releases the lock."""
    from conftest import start_broker

    first = start_broker(tmp_path)
    try:
        env = dict(first.env)
        env.update({"CONNECTORS_KAFKA_PORT": str(free_port()),
                    "CONNECTORS_KAFKA_TLS_PORT": str(free_port()),
                    "KMQKAFKA_HTTP_PORT": str(free_port())})
        proc = subprocess.run([str(TWISTD), "-n", "--pidfile=", "kmqkafka"], cwd=tmp_path,
                              env=env, capture_output=True, timeout=60)
        lines = [l for l in (proc.stdout + proc.stderr).decode().splitlines() if l.strip()]
        assert proc.returncode == 1, lines
        assert len(lines) == 1 and "KMQKAFKA_DATA_DIR" in lines[0] and "in use" in lines[0]
        assert first.proc.poll() is None
        first.kill()
        second = start_broker(tmp_path, env=env)  # the kernel released the dead one's lock
        second.stop()
    finally:
        if first.proc.poll() is None:
            first.kill()
