"""ApiVersions (key 18): the advertised version table, computed from the dispatcher's registry.

An error is answered as Kafka's ``ApiVersionsRequest.getErrorResponse`` builds it. A request at a
version this broker does not serve gets the v0 layout (response header v0) with UNSUPPORTED_VERSION
(35) and one entry, ApiVersions' own range, which is all a client needs to retry (KIP-511); a v3+
request whose client software name or version is malformed gets INVALID_REQUEST (42) and no table.

From v3 a successful answer also carries the KIP-584 features (tagged fields) a Kafka 4.1 broker
reports for what this broker does: ``metadata.version`` supported from 3.3-IV3 (7, the oldest
Kafka 4 reads) to 4.1-IV1 (27, 4.1's latest production level) and finalized at 27, matching the
4.1 table advertised; ``group.version`` supported 0-1 and finalized at 1 (the KIP-848 consumer
protocol) while ConsumerGroupHeartbeat is served. Features this broker does not implement
(``transaction.version``, ``kraft.version``, ``share.version``, ...) stay at level 0, which Kafka
leaves out of both lists. As Kafka (KAFKA-17011), a v3 answer omits supported features whose
minimum is 0: clients that only know v3 cannot read one.
"""
from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32Timedelta, i64

from kmqkafka.dispatch import Dispatcher
from kmqkafka.kafka.context import RequestContext

API_KEY = 18
PRODUCE_API_KEY = 0
MIN_VERSION = 0
MAX_VERSION = 4

# KIP-511: client software name/version must match this; otherwise INVALID_REQUEST.
_SOFTWARE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


# Produce is listed from v0 although v0-v2 are refused (their connection is closed), as Kafka
# 4 lists it (KAFKA-18659): librdkafka before 2.10 turns gzip, snappy and lz4 off, silently,
# against a broker whose Produce range does not start at 0 (Debian's kcat is one).
_LISTED_MIN = {PRODUCE_API_KEY: 0}


METADATA_VERSION = "metadata.version"
GROUP_VERSION = "group.version"
CONSUMER_GROUP_HEARTBEAT_API_KEY = 68
SHARE_VERSION = "share.version"
SHARE_GROUP_HEARTBEAT_API_KEY = 76
# Kafka's epoch is the metadata offset of the last feature change; here the features never
# change while a node runs. It must be at least 0: Java clients keep finalized features only
# from a response whose epoch is above the last they saw (initially -1).
FINALIZED_FEATURES_EPOCH = 0


@dataclass(frozen=True)
class Feature:
    """A KIP-584 feature: the levels this broker supports and its finalized level (0 is not
    finalized, and left out of the finalized list)."""
    name: str
    min_version: int
    max_version: int
    finalized: int


def features(dispatcher: Dispatcher) -> list[Feature]:
    """The features this broker supports, from what ``dispatcher`` serves."""
    served = [Feature(METADATA_VERSION, 7, 27, 27)]
    keys = {k for k, _, _ in dispatcher.advertised()}
    if CONSUMER_GROUP_HEARTBEAT_API_KEY in keys:
        served.append(Feature(GROUP_VERSION, 0, 1, 1))
    if SHARE_GROUP_HEARTBEAT_API_KEY in keys:  # KIP-932: share groups are on
        served.append(Feature(SHARE_VERSION, 0, 1, 1))
    return served


def build_response(dispatcher: Dispatcher, version: int, error: ErrorCode) -> Any:
    """The ApiVersions response of ``version``: ``dispatcher.advertised()`` when ``error`` is none,
    only ApiVersions' own entry for UNSUPPORTED_VERSION, and an empty table for any other error."""
    module = load_payload_module(API_KEY, version, EntityType.response)
    keys = tuple(
        module.ApiVersion(api_key=i16(k), min_version=i16(_LISTED_MIN.get(k, lo)),
                          max_version=i16(hi))
        for k, lo, hi in dispatcher.advertised()
        if error == ErrorCode.none or (error == ErrorCode.unsupported_version and k == API_KEY)
    )
    kwargs: dict[str, Any] = {"error_code": error, "api_keys": keys}
    if version >= 1:
        kwargs["throttle_time"] = i32Timedelta.parse(datetime.timedelta(0))
    if version >= 3 and error == ErrorCode.none:
        served = features(dispatcher)
        kwargs["supported_features"] = tuple(
            module.SupportedFeatureKey(name=f.name, min_version=i16(f.min_version),
                                       max_version=i16(f.max_version))
            for f in served if version >= 4 or f.min_version > 0)
        kwargs["finalized_features"] = tuple(
            module.FinalizedFeatureKey(name=f.name, max_version_level=i16(f.finalized),
                                       min_version_level=i16(f.finalized))
            for f in served if f.finalized > 0)
        kwargs["finalized_features_epoch"] = i64(FINALIZED_FEATURES_EPOCH)
    return module.ApiVersionsResponse(**kwargs)


def register(dispatcher: Dispatcher) -> None:
    """Register the ApiVersions handler (v0–v4) on ``dispatcher``."""

    def handle(request: Any, ctx: RequestContext) -> Any:
        error = ErrorCode.none
        if ctx.api_version >= 3 and not (
            _SOFTWARE.fullmatch(request.client_software_name)
            and _SOFTWARE.fullmatch(request.client_software_version)
        ):
            error = ErrorCode.invalid_request
        return build_response(dispatcher, ctx.api_version, error)

    def unsupported(version: int) -> tuple[Any, int]:
        return build_response(dispatcher, 0, ErrorCode.unsupported_version), 0

    dispatcher.register(API_KEY, handle, MIN_VERSION, MAX_VERSION, on_unsupported=unsupported)
