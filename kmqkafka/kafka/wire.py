"""Helpers for building kio responses across API versions.

kio generates one module per (API, version); nested types live beside the
response class. ``make`` drops fields a version does not have, so one handler
can build every version of its response from one set of keyword arguments.
"""

from __future__ import annotations

import datetime
import sys
from types import ModuleType
from typing import Any

from kmqkafka.kafka.context import RequestContext

NO_THROTTLE = datetime.timedelta(0)


def types_of(ctx: RequestContext) -> ModuleType:
    """The kio response module for this request's API and version."""
    return sys.modules[ctx.response_type.__module__]


def make(cls: type, **fields: Any) -> Any:
    """Instantiate a kio dataclass with the subset of ``fields`` its version defines."""
    known = cls.__dataclass_fields__
    return cls(**{k: v for k, v in fields.items() if k in known})


def has_field(cls: type, name: str) -> bool:
    return name in cls.__dataclass_fields__
