"""ApiVersions and the dispatcher registry: advertising comes from what is registered."""
from __future__ import annotations

import io
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer

from kmqkafka.dispatch import CLOSE_CONNECTION, Dispatcher, error_response
from kmqkafka.kafka import api_versions
from kmqkafka.kafka.context import RequestContext


def noop(request: Any, ctx: Any) -> None:
    return None


def ctx_for(d: Dispatcher, key: int, version: int) -> RequestContext:
    return RequestContext(api_key=key, api_version=version, correlation_id=1, client_id="t",
                          response_type=d.response_type(key, version), broker=None)


def test_table_lists_exactly_the_registered_apis() -> None:
    d = Dispatcher()
    api_versions.register(d)
    d.register(3, noop, 0, 12)
    assert d.advertised() == [(3, 0, 12), (18, 0, 4)]
    response = api_versions.build_response(d, 3, ErrorCode.none)
    assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [
        (3, 0, 12), (18, 0, 4)]


def test_declared_range_is_clipped_to_versions_kio_can_load() -> None:
    d = Dispatcher()
    reg = d.register(18, noop, 0, 500)
    assert reg.max_version < 500
    assert d.supports(18, reg.max_version) and not d.supports(18, reg.max_version + 1)


def test_register_refuses_duplicates_and_unloadable_ranges() -> None:
    d = Dispatcher()
    d.register(18, noop, 0, 4)
    with pytest.raises(ValueError):
        d.register(18, noop, 0, 4)
    with pytest.raises(ValueError):
        d.register(18000, noop, 0, 1)
    with pytest.raises(ValueError):
        d.register(3, noop, 5, 2)


def test_decorator_registers() -> None:
    d = Dispatcher()

    @d.handler(3, 1, 2)
    def metadata(request: Any, ctx: Any) -> None: ...

    assert d.lookup(3).handler is metadata and d.supports(3, 2) and not d.supports(3, 0)


@pytest.mark.parametrize("version", range(0, 5))
def test_every_version_round_trips(version: int) -> None:
    d = Dispatcher()
    api_versions.register(d)
    response = api_versions.build_response(d, version, ErrorCode.none)
    buf = io.BytesIO()
    entity_writer(type(response))(buf, response)
    decoded, n = entity_reader(type(response))(buf.getvalue(), 0)
    assert decoded == response and n == len(buf.getvalue())
    assert type(response).__header_schema__.__version__ == 0  # always response header v0


def test_unsupported_version_answers_v0_with_error_35() -> None:
    d = Dispatcher()
    api_versions.register(d)
    response, header_version = d.unsupported_version_response(18, 7)
    assert header_version == 0 and type(response).__version__ == 0
    assert response.error_code == ErrorCode.unsupported_version
    assert [k.api_key for k in response.api_keys] == [18]


def test_unsupported_version_of_other_api_uses_its_layout_or_closes() -> None:
    d = Dispatcher()
    d.register(10, noop, 0, 1)  # FindCoordinator v0-1 have a top-level error_code
    d.register(0, noop, 3, 3)  # Produce errors are per partition only
    response, _ = d.unsupported_version_response(10, 2)
    assert response.error_code == ErrorCode.unsupported_version
    assert d.unsupported_version_response(0, 5) is None
    assert d.unsupported_version_response(10, 999) is None


def test_invalid_client_software_name_is_invalid_request() -> None:
    d = Dispatcher()
    api_versions.register(d)
    request_type = d.request_type(18, 3)
    result = d.dispatch(request_type(client_software_name="-bad-", client_software_version="1"),
                        ctx_for(d, 18, 3))
    assert result.result.error_code == ErrorCode.invalid_request


def test_handler_failure_without_top_level_error_closes() -> None:
    d = Dispatcher()

    def boom(request: Any, ctx: Any) -> Any:
        raise RuntimeError("boom")

    d.register(0, boom, 3, 3)
    out: list[Any] = []
    d.dispatch(object(), ctx_for(d, 0, 3)).addCallback(out.append)
    assert out == [CLOSE_CONNECTION]


def test_generic_error_responses_encode_for_every_kio_response() -> None:
    built = 0
    for key in api_key_map:
        for version in range(0, 20):
            try:
                response_type = load_response_schema(key, version)
            except Exception:
                continue
            response = error_response(response_type, ErrorCode.unknown_server_error)
            if response is None:
                continue
            entity_writer(response_type)(io.BytesIO(), response)
            built += 1
    assert built > 100


def test_features_follow_what_is_served() -> None:
    """group.version is reported (finalized at 1) only while ConsumerGroupHeartbeat is served,
    share.version only while ShareGroupHeartbeat is; metadata.version always; error answers
    carry none."""
    d = Dispatcher()
    api_versions.register(d)
    bare = api_versions.build_response(d, 4, ErrorCode.none)
    assert [f.name for f in bare.finalized_features] == ["metadata.version"]
    d.register(68, noop, 0, 1)
    full = api_versions.build_response(d, 4, ErrorCode.none)
    assert [(f.name, f.min_version, f.max_version) for f in full.supported_features] == [
        ("metadata.version", 7, 27), ("group.version", 0, 1)]
    assert [f.name for f in full.finalized_features] == ["metadata.version", "group.version"]
    assert api_versions.build_response(d, 4, ErrorCode.invalid_request).finalized_features == ()
    d.register(76, noop, 1, 1)
    shared = api_versions.build_response(d, 4, ErrorCode.none)
    assert [f.name for f in shared.finalized_features] == [
        "metadata.version", "group.version", "share.version"]
