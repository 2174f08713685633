"""The metrics and health site: ``/metrics`` (Prometheus text) and ``/health``.

``/health`` answers 200 ``ok`` once ``is_ready()`` is true (the store has recovered and the
listeners are open) and 503 otherwise, so orchestration can wait on it.
"""
from __future__ import annotations

from typing import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from twisted.web.resource import Resource
from twisted.web.server import Request, Site


class MetricsResource(Resource):
    """Renders the injected registry in the Prometheus text format."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__()
        self._registry = registry

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode("ascii"))
        return generate_latest(self._registry)


class HealthResource(Resource):
    """200 ``ok`` when ready, else 503 ``starting``/``stopping``."""

    isLeaf = True

    def __init__(self, is_ready: Callable[[], bool]) -> None:
        super().__init__()
        self._is_ready = is_ready

    def render_GET(self, request: Request) -> bytes:
        request.setHeader(b"content-type", b"text/plain; charset=utf-8")
        if self._is_ready():
            return b"ok\n"
        request.setResponseCode(503)
        return b"not ready\n"


def build_site(registry: CollectorRegistry, is_ready: Callable[[], bool]) -> Site:
    """The twisted.web site serving ``/metrics`` and ``/health``."""
    root = Resource()
    root.putChild(b"metrics", MetricsResource(registry))
    root.putChild(b"health", HealthResource(is_ready))
    site = Site(root)
    site.displayTracebacks = False
    site.noisy = False
    return site
