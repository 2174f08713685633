"""ApiVersions (key 18): the advertised version table, computed from the dispatcher's registry.

An error is answered as Kafka's ``ApiVersionsRequest.getErrorResponse`` builds it. A request at a
version this broker does not serve gets the v0 layout (response header v0) with UNSUPPORTED_VERSION
(35) and one entry, ApiVersions' own range, which is all a client needs to retry (KIP-511); a v3+
request whose client software name or version is malformed gets INVALID_REQUEST (42) and no table.
"""
from __future__ import annotations

import datetime
import re
from typing import Any

from kio.index import load_payload_module
from kio.schema.errors import ErrorCode
from kio.static.constants import EntityType
from kio.static.primitive import i16, i32Timedelta

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
