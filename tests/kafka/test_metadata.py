"""Metadata over real sockets: advertised endpoint, auto-create, invalid names, restart-stable ids."""

import struct
import sys

from confluent_kafka import KafkaError
from kio.index import load_request_schema
from test_produce_fetch import _build
from twisted.internet.defer import Deferred, succeed
from confluent_kafka.admin import AdminClient

from conftest import free_port, start_broker


def admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap})


def test_advertised_host_and_port_are_what_clients_are_told(tmp_path):
    port = free_port()
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_PORT": str(port),
                                    "CONNECTORS_KAFKA_ADVERTISED_HOST": "localhost",
                                    "CONNECTORS_KAFKA_ADVERTISED_PORT": str(port)})
    try:
        md = admin(b.bootstrap).list_topics(timeout=10)
        assert [(x.host, x.port) for x in md.brokers.values()] == [("localhost", port)]
        assert md.controller_id == 1
    finally:
        b.stop()
    other = free_port()
    (tmp_path / "2").mkdir()
    b = start_broker(tmp_path / "2", env={"CONNECTORS_KAFKA_ADVERTISED_HOST": "kafka.example.test",
                                          "CONNECTORS_KAFKA_ADVERTISED_PORT": str(other)})
    try:
        md = admin(b.bootstrap).list_topics(timeout=10)
        assert [(x.host, x.port) for x in md.brokers.values()] == [("kafka.example.test", other)]
    finally:
        b.stop()


def test_metadata_auto_creates_a_one_partition_topic(broker):
    md = admin(broker.bootstrap).list_topics(topic="auto.created", timeout=10)
    topic = md.topics["auto.created"]
    assert topic.error is None
    assert list(topic.partitions) == [0]
    assert topic.partitions[0].leader == 1
    assert "auto.created" in admin(broker.bootstrap).list_topics(timeout=10).topics


def test_auto_create_can_be_turned_off(tmp_path):
    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_AUTO_CREATE_TOPICS": "false"})
    try:
        md = admin(b.bootstrap).list_topics(topic="not.there", timeout=10)
        assert md.topics["not.there"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        assert "not.there" not in admin(b.bootstrap).list_topics(timeout=10).topics
    finally:
        b.stop()


def test_num_partitions_sets_auto_created_and_countless_topics(tmp_path):
    """Kafka's num.partitions: auto-create (Produce and Metadata) and CreateTopics without a
    count use it; DescribeConfigs reports it as the broker's static setting."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import ConfigResource, NewTopic

    b = start_broker(tmp_path, env={"CONNECTORS_KAFKA_NUM_PARTITIONS": "3"})
    try:
        a = admin(b.bootstrap)
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce("by.produce", b"v")
        assert p.flush(15) == 0
        assert len(a.list_topics(topic="by.metadata", timeout=10)
                   .topics["by.metadata"].partitions) == 3
        a.create_topics([NewTopic("by.create")])["by.create"].result(10)
        topics = a.list_topics(timeout=10).topics
        assert [len(topics[n].partitions) for n in ("by.produce", "by.metadata", "by.create")] == [
            3, 3, 3]
        res = ConfigResource(ConfigResource.Type.BROKER, "1")
        entry = a.describe_configs([res])[res].result(10)["num.partitions"]
        assert entry.value == "3" and entry.source == 4  # STATIC_BROKER_CONFIG
    finally:
        b.stop()


def test_kafka_python_pinned_to_kafka_4_works_and_infers_one_release(broker):
    """kafka-python pinned to a Kafka 4.x release sends the requests of its own table
    (Metadata v13 among them) without negotiating; left to infer, it must find one release
    whose every API version this broker serves (4.1: not 4.2's OffsetCommit v10)."""
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

    for pinned in ((4, 0, 0), (4, 1, 0)):
        p = KafkaProducer(bootstrap_servers=broker.bootstrap, api_version=pinned)
        meta = p.send("pinned", value=b"%d" % pinned[1]).get(timeout=20)
        p.close()
        c = KafkaConsumer(bootstrap_servers=broker.bootstrap, api_version=pinned,
                          auto_offset_reset="earliest", consumer_timeout_ms=5000)
        c.assign([TopicPartition("pinned", 0)])
        c.seek(TopicPartition("pinned", 0), meta.offset)
        assert next(iter(c)).value == b"%d" % pinned[1]
        c.close()
    a = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        assert a._client.check_version() == (4, 1)
    finally:
        a.close()


def test_tilde_in_a_topic_name_is_invalid_topic_exception(broker):
    md = admin(broker.bootstrap).list_topics(topic="bad~name", timeout=10)
    assert md.topics["bad~name"].error.code() == KafkaError.TOPIC_EXCEPTION  # 17
    assert "bad~name" not in admin(broker.bootstrap).list_topics(timeout=10).topics


def test_auto_create_of_a_colliding_name_answers_that_topic_alone(broker):
    """'coll.one' exists; Metadata for it and 'coll_one' (which collides once '.' and '_' are
    identified) answers each topic on its own, on the same connection."""
    from kio.index import load_request_schema

    from rawkafka import RawClient

    a = admin(broker.bootstrap)
    assert a.list_topics(topic="coll.one", timeout=10).topics["coll.one"].error is None
    request_type = load_request_schema(3, 12)
    topic_type = sys.modules[request_type.__module__].MetadataRequestTopic
    request = request_type(
        topics=tuple(topic_type(topic_id=None, name=name) for name in ("coll.one", "coll_one")),
        allow_auto_topic_creation=True, include_topic_authorized_operations=False)
    with RawClient(broker.kafka_port) as raw:
        for _ in range(2):  # the connection stays usable
            response = raw.call(request)
            errors = {t.name: int(t.error_code) for t in response.topics}
            assert errors == {"coll.one": 0, "coll_one": 17}  # INVALID_TOPIC_EXCEPTION
    assert "coll_one" not in a.list_topics(timeout=10).topics
    assert "Traceback" not in broker.log()


def test_a_null_topic_name_gets_an_error_not_a_dropped_connection(broker):
    from kio.index import load_request_schema

    from rawkafka import RawClient

    for version in (10, 11, 12):
        request_type = load_request_schema(3, version)
        topic_type = sys.modules[request_type.__module__].MetadataRequestTopic
        extra = {"include_cluster_authorized_operations": False} if version < 11 else {}
        request = request_type(topics=(topic_type(topic_id=None, name=None),),
                               allow_auto_topic_creation=True,
                               include_topic_authorized_operations=False, **extra)
        with RawClient(broker.kafka_port) as raw:
            (topic,) = raw.call(request).topics
        assert int(topic.error_code) == 17, version  # INVALID_TOPIC_EXCEPTION
    assert "Traceback" not in broker.log()


def test_an_unknown_topic_id_is_echoed_with_its_error(broker):
    """Metadata v10+ by topic id: an id no topic has is UNKNOWN_TOPIC_ID with that id (the
    name null), so the client can tell which of its ids failed; a known id gets its topic."""
    import uuid

    from kio.index import load_request_schema

    from rawkafka import RawClient

    admin(broker.bootstrap).list_topics(topic="by.id", timeout=10)  # auto-created
    request_type = load_request_schema(3, 12)
    topic_type = sys.modules[request_type.__module__].MetadataRequestTopic
    with RawClient(broker.kafka_port) as raw:
        (known,) = raw.call(request_type(
            topics=(topic_type(topic_id=None, name="by.id"),), allow_auto_topic_creation=False,
            include_topic_authorized_operations=False)).topics
        missing = uuid.uuid4()
        found, unknown = raw.call(request_type(
            topics=(topic_type(topic_id=known.topic_id, name=None),
                    topic_type(topic_id=missing, name=None)),
            allow_auto_topic_creation=False, include_topic_authorized_operations=False)).topics
    assert (found.name, found.topic_id, int(found.error_code)) == ("by.id", known.topic_id, 0)
    assert (unknown.name, unknown.topic_id, int(unknown.error_code)) == (None, missing, 100)


def test_topics_and_cluster_id_survive_a_restart(tmp_path):
    b = start_broker(tmp_path)
    try:
        md = admin(b.bootstrap).list_topics(topic="kept", timeout=10)
        cluster_id = md.cluster_id
        assert md.topics["kept"].error is None
        b.stop()
        b.restart()
        md2 = admin(b.bootstrap).list_topics(timeout=10)
        assert "kept" in md2.topics
        assert md2.cluster_id == cluster_id
    finally:
        b.stop()


def test_every_full_listing_shows_each_topic_change_at_once(broker):
    """A full Metadata answer is reused while nothing changed; each create, growth and delete
    shows in the very next one."""
    from confluent_kafka.admin import NewPartitions, NewTopic

    a = admin(broker.bootstrap)

    def listing():
        md = a.list_topics(timeout=10)
        return {name: len(t.partitions) for name, t in md.topics.items()}

    before = listing()
    assert listing() == before
    a.create_topics([NewTopic("md.cache", 2)])["md.cache"].result(10)
    assert listing() == {**before, "md.cache": 2}
    a.create_partitions([NewPartitions("md.cache", 5)])["md.cache"].result(10)
    assert listing()["md.cache"] == 5
    a.delete_topics(["md.cache"])["md.cache"].result(10)
    assert listing() == before


def test_a_full_listing_is_built_and_encoded_once_while_nothing_changes(tmp_path):
    """In process: the same response object for every full Metadata of an unchanged catalog,
    its body encoded once; a new topic makes a new one."""
    from test_produce_fetch import InProcess

    from kmqkafka.kafka import metadata
    from kmqkafka.net import shared
    from kmqkafka.net.protocol import KafkaProtocol

    env = InProcess(tmp_path)
    request = _build(load_request_schema(3, 12), dict(
        topics=None, allow_auto_topic_creation=True,
        include_topic_authorized_operations=False))

    def full():
        out: list = []
        d = metadata.handle(request, env.ctx(3, 12))
        (d if isinstance(d, Deferred) else succeed(d)).addBoth(out.append)
        env.clock.advance(0)
        return out[0]

    catalog = env.broker.extras["topics"]
    for name in ("a", "b"):
        catalog.create(name)
        env.clock.advance(0)
    first = full()
    assert sorted(t.name for t in first.topics) == ["a", "b"]
    assert full() is first
    header_version = env.ctx(3, 12).response_type.__header_schema__.__version__
    wire = b"".join(bytes(p) for p in KafkaProtocol._encode(7, first, header_version))
    assert shared.body(first) is not None
    again = b"".join(bytes(p) for p in KafkaProtocol._encode(8, first, header_version))
    assert again[4:8] == struct.pack(">i", 8) and again[8:] == wire[8:]
    catalog.create("c")
    env.clock.advance(0)
    grown = full()
    assert grown is not first
    assert sorted(t.name for t in grown.topics) == ["a", "b", "c"]
