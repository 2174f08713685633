"""Coordinators: the classic consumer-group state machine and committed offsets.

They know nothing of the wire: handlers in ``kmqkafka.kafka`` translate kio requests into calls
here and results back into kio responses.
"""
