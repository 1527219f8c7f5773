"""The store's event registry, as the catalog fills it, and the field types its modules share.

``REGISTRY`` holds every event type gyre_store can decode. The catalog modules register
their types in it when ``gyre_store.catalog`` is imported (which importing ``gyre_store``
does); a package that owns further types (``gyre_sched``'s ``sched.*``) registers them
explicitly with a function of its own.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from gyre_store.log import REGISTRY

__all__ = ["REGISTRY", "Ident", "NonNegative", "Positive"]

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
Positive = Annotated[int, msgspec.Meta(ge=1)]
Ident = Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
