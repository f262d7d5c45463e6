"""What the control plane's use cases hand back and take in, shared by :mod:`~baton.control.catalogue` and
:mod:`~baton.control.policies`: a page of views, the caller's precondition on a row's version, and the
marker of a field a change leaves alone.

Views are frozen dataclasses copied out of the unit of work before it closes: no ORM instance leaves a
use case, so a surface can never lazy-load, mutate or re-attach one. The same views are the wire shapes
of ``/admin/v1`` and the console's JSON (FastAPI serializes a dataclass as it is): a view is the one shape of
its row, and a field's docstring is its description in the OpenAPI document (:data:`WIRE_SCHEMA`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

#: Called with a row's current version inside the use case's transaction, before anything changes;
#: raises :class:`baton.core.errors.PreconditionFailedError` when the caller's copy is stale (HTTP:
#: ``If-Match``). ``None``: the caller does not care.
Precondition = Callable[[int], None]


class Unset(enum.Enum):
    """A field a change command leaves as it is (``None`` is a value: it clears the field)."""

    UNSET = "unset"


UNSET = Unset.UNSET

#: A view's ``__pydantic_config__``: its fields' docstrings become their descriptions on the wire. A plain
#: dict (pydantic's ``ConfigDict`` is one), so the control plane does not import pydantic.
WIRE_SCHEMA = {"use_attribute_docstrings": True}


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing and how many items match it in all."""

    items: Sequence[T]
    total: int
    limit: int
    offset: int


def check(expect: Precondition | None, version: int) -> None:
    if expect is not None:
        expect(version)
