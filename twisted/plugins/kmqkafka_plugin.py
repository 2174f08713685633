"""Registers ``twistd kmqkafka``; everything else lives in kmqkafka.tap."""
from twisted.application.service import ServiceMaker

kmqkafka = ServiceMaker(
    "kmqkafka", "kmqkafka.tap", "Kafka-wire-compatible broker on a durable channel store", "kmqkafka"
)
