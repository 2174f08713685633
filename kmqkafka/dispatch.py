"""The one registry from Kafka API key to handler, and the place handler errors become wire codes.

Registering::

    dispatcher.register(api_key, handler, min_version, max_version)
    # or
    @dispatcher.handler(api_key, min_version, max_version)
    def handle(request, ctx): ...

A handler is ``handler(request, ctx) -> Deferred[response] | response`` where ``request`` is the
kio request dataclass for ``ctx.api_version`` and the response is an instance of
``ctx.response_type``. It may return ``NO_RESPONSE`` (acks=0 Produce): nothing is written but the
connection's response order is kept; or ``CLOSE_CONNECTION`` (a failed acks=0 Produce): the
connection closes once the responses before it are written. Handlers never touch the transport.

The advertised table (ApiVersions) is computed from the registry: an API is advertised with the
versions its handler declares, clipped to the contiguous range whose kio request and response
classes both load, so advertising cannot drift from what is implemented.

Errors: an unexpected exception (or a wrong response type) from a handler is logged once; if the
response class has a top-level ``error_code`` field the client gets a response whose every
top-level error field is UNKNOWN_SERVER_ERROR (-1) and every other field is empty/zero; otherwise
(e.g. Produce, Fetch, whose errors are per partition) the connection is closed, which clients treat
as a retriable network error. Unsupported versions follow the same rule with UNSUPPORTED_VERSION
(35), except where an API registers its own ``on_unsupported`` (ApiVersions answers in v0 layout).
"""
from __future__ import annotations

import dataclasses
import datetime
import functools
import typing
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType
from twisted.internet.defer import CancelledError, Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from kmqkafka.kafka.context import RequestContext

_request_schema = functools.lru_cache(maxsize=None)(load_request_schema)
_response_schema = functools.lru_cache(maxsize=None)(load_response_schema)

Handler = Callable[[Any, RequestContext], "Deferred[Any] | Any"]
# on_unsupported(api_version) -> (response, response_header_version) or None to close.
UnsupportedHook = Callable[[int], "tuple[Any, int] | None"]


class _Sentinel:
    def __init__(self, name: str) -> None:
        self._name = name

    def __repr__(self) -> str:
        return self._name


NO_RESPONSE: Any = _Sentinel("NO_RESPONSE")
"""Returned by a handler when the request has no response (Produce with acks=0)."""

CLOSE_CONNECTION: Any = _Sentinel("CLOSE_CONNECTION")
"""Produced by ``Dispatcher.dispatch`` when the only safe answer is closing the connection."""


def api_name(api_key: int) -> str:
    """kio's snake-case name of an API key (``"api_versions"``), or ``"unknown_<key>"``."""
    return api_key_map.get(api_key, f"unknown_{api_key}")


@dataclass(frozen=True)
class Registration:
    """One API's handler and the version range advertised for it."""

    api_key: int
    handler: Handler
    min_version: int
    max_version: int
    on_unsupported: UnsupportedHook | None = None
    wait_only: bool = False


def _loadable(api_key: int, version: int) -> bool:
    """Whether kio has request and response classes for this version, looked up in kio's
    static index: importing every advertised version's modules would add about a second to
    start-up (each is a few dozen dataclasses); they load on first use instead."""
    try:
        entities = schema_name_map[api_key_map[api_key]][version]
    except KeyError:
        return False
    return EntityType.request in entities and EntityType.response in entities


_EMPTY_BY_KAFKA_TYPE: dict[str, Any] = {
    "bool": False,
    "bytes": b"",
    "records": None,
    "string": "",
    "uuid": uuid.UUID(int=0),
    "timedelta_i32": datetime.timedelta(0),
    "timedelta_i64": datetime.timedelta(0),
    "datetime_i64": datetime.datetime.fromtimestamp(0, datetime.timezone.utc),
    "float64": 0.0,
}


def _empty_value(f: dataclasses.Field[Any], hints: dict[str, Any], code: ErrorCode) -> Any:
    tp = hints[f.name]
    if typing.get_origin(tp) is tuple:
        return ()
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type == "error_code":
        return code
    args = typing.get_args(tp)
    if type(None) in args:
        return None
    if kafka_type is None:  # nested entity
        return _build_empty(tp, code)
    if kafka_type in _EMPTY_BY_KAFKA_TYPE:
        return _EMPTY_BY_KAFKA_TYPE[kafka_type]
    return tp(0)  # integer primitives (i8..i64, u16, ...)


def _build_empty(entity_type: type, code: ErrorCode) -> Any:
    hints = typing.get_type_hints(entity_type)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(entity_type):
        if f.metadata.get("kafka_type") == "error_code":
            kwargs[f.name] = code
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = _empty_value(f, hints, code)
    return entity_type(**kwargs)


def error_response(response_type: type, code: ErrorCode) -> Any | None:
    """A response of ``response_type`` carrying ``code`` in every top-level error field.

    Returns ``None`` when the type has no top-level ``error_code`` field (errors there are per
    partition or per resource and cannot be expressed without the request), or cannot be built.
    """
    fields = dataclasses.fields(response_type)
    if not any(f.metadata.get("kafka_type") == "error_code" for f in fields):
        return None
    try:
        return _build_empty(response_type, code)
    except Exception:  # a schema shape this generic builder does not know
        return None


class Dispatcher:
    """API key → handler registry; reactor-thread only."""

    log = Logger()

    def __init__(self) -> None:
        self._registry: dict[int, Registration] = {}

    def register(
        self,
        api_key: int,
        handler: Handler,
        min_version: int,
        max_version: int,
        on_unsupported: UnsupportedHook | None = None,
        *,
        wait_only: bool = False,
    ) -> Registration:
        """Register ``handler`` for ``api_key``, advertising ``min_version..max_version``.

        ``wait_only``: the handler's Deferred may be cancelled when its connection goes (a
        parked Fetch, a JoinGroup waiting for the rebalance), since only its answer is lost.
        Every other request runs to the end once read, as in Kafka: a Produce whose client
        hung up is still appended; only its response is dropped.

        The advertised range is clipped to the versions kio can decode and encode. Raises
        ``ValueError`` if the key is already registered or no version in the range loads.
        """
        if api_key in self._registry:
            raise ValueError(f"API key {api_key} ({api_name(api_key)}) is already registered")
        if min_version < 0 or max_version < min_version:
            raise ValueError(f"bad version range {min_version}..{max_version} for {api_key}")
        top = min_version - 1
        for version in range(min_version, max_version + 1):
            if not _loadable(api_key, version):
                break
            top = version
        if top < min_version:
            raise ValueError(f"kio has no classes for {api_name(api_key)} v{min_version}")
        reg = Registration(api_key, handler, min_version, top, on_unsupported, wait_only)
        self._registry[api_key] = reg
        return reg

    def handler(
        self, api_key: int, min_version: int, max_version: int
    ) -> Callable[[Handler], Handler]:
        """Decorator form of ``register``; returns the handler unchanged."""

        def decorate(fn: Handler) -> Handler:
            self.register(api_key, fn, min_version, max_version)
            return fn

        return decorate

    def wrap(self, api_key: int, wrapper: Callable[[Handler], Handler]) -> bool:
        """Replace a registered handler by ``wrapper(handler)`` (same versions): the hook for
        routing an area's API elsewhere, e.g. leader-only APIs in a cluster. False if the key
        is not registered."""
        reg = self._registry.get(api_key)
        if reg is None:
            return False
        self._registry[api_key] = dataclasses.replace(reg, handler=wrapper(reg.handler))
        return True

    def lookup(self, api_key: int) -> Registration | None:
        """The registration for ``api_key``, or ``None`` if the key is not served."""
        return self._registry.get(api_key)

    def wait_only(self, api_key: int) -> bool:
        """Whether a request of ``api_key`` may be cancelled when its connection goes."""
        reg = self._registry.get(api_key)
        return reg is not None and reg.wait_only

    def supports(self, api_key: int, api_version: int) -> bool:
        """Whether (``api_key``, ``api_version``) is advertised and will reach a handler."""
        reg = self._registry.get(api_key)
        return reg is not None and reg.min_version <= api_version <= reg.max_version

    def request_type(self, api_key: int, api_version: int) -> type:
        """kio request class of a supported (``api_key``, ``api_version``)."""
        return _request_schema(api_key, api_version)

    def response_type(self, api_key: int, api_version: int) -> type:
        """kio response class of a supported (``api_key``, ``api_version``)."""
        return _response_schema(api_key, api_version)

    def advertised(self) -> list[tuple[int, int, int]]:
        """``(api_key, min_version, max_version)`` for every registered API, by key."""
        return [(k, r.min_version, r.max_version) for k, r in sorted(self._registry.items())]

    def unsupported_version_response(self, api_key: int, api_version: int) -> tuple[Any, int] | None:
        """The answer to a registered API at an unadvertised version.

        Returns ``(response, response_header_version)`` or ``None`` meaning close the connection.
        """
        reg = self._registry.get(api_key)
        if reg is None:
            return None
        if reg.on_unsupported is not None:
            return reg.on_unsupported(api_version)
        try:
            response_type = load_response_schema(api_key, api_version)
        except (UnknownAPIKey, UnknownEntity, ImportError, AttributeError):
            return None
        response = error_response(response_type, ErrorCode.unsupported_version)
        if response is None:
            return None
        return response, response_type.__header_schema__.__version__

    def dispatch(self, request: Any, ctx: RequestContext) -> Deferred[Any]:
        """Run the handler for ``ctx.api_key``; never fails.

        Fires with a response of ``ctx.response_type``, ``NO_RESPONSE`` or ``CLOSE_CONNECTION``.
        Cancelling the returned Deferred cancels the handler's Deferred (connection lost, for
        ``wait_only`` registrations).
        """
        reg = self._registry[ctx.api_key]
        d = maybeDeferred(reg.handler, request, ctx)
        d.addCallbacks(self._check, self._failed, callbackArgs=(ctx,), errbackArgs=(ctx,))
        return d

    def _check(self, response: Any, ctx: RequestContext) -> Any:
        if response is NO_RESPONSE or response is CLOSE_CONNECTION \
                or type(response) is ctx.response_type:
            return response
        return self._failed(
            Failure(TypeError(f"handler returned {type(response).__name__}, expected "
                              f"{ctx.response_type.__name__}")),
            ctx,
        )

    def _failed(self, failure: Failure, ctx: RequestContext) -> Any:
        if failure.check(CancelledError):
            return failure
        self.log.failure(
            "handler for {api} v{version} failed (correlation {correlation_id}, client"
            " {client_id})",
            failure,
            api=api_name(ctx.api_key),
            version=ctx.api_version,
            correlation_id=ctx.correlation_id,
            client_id=ctx.client_id,
        )
        if ctx.broker is not None:
            ctx.broker.metrics.kafka_request_errors.labels(
                api_name(ctx.api_key), str(ctx.api_version)
            ).inc()
        response = error_response(ctx.response_type, ErrorCode.unknown_server_error)
        return CLOSE_CONNECTION if response is None else response


__all__ = [
    "CLOSE_CONNECTION",
    "Dispatcher",
    "Handler",
    "NO_RESPONSE",
    "Registration",
    "api_name",
    "error_response",
]
