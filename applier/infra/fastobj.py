"""Fast constructors for frozen, slotted dataclasses built once per row change.

A frozen dataclass's ``__init__`` sets each field through ``object.__setattr__(self, "name", value)``,
a by-name lookup per field; for the records made per change (decoded messages, buffered changes,
row images, table changes) that was a large share of the Python time of a catch-up. A fast
constructor fills a "layout twin" instead: a plain class with the very same ``__slots__`` (so the
same memory layout) and no ``__setattr__``, whose attribute stores are CPython's fastest, and then
re-labels the object as the frozen class (``__class__`` assignment, which CPython allows only
between identical layouts). The result IS an instance of the frozen class: same fields, equality,
hash and immutability; tests check that it equals what the regular constructor builds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def layout_twin(cls: type) -> type:
    """A plain class with ``cls``'s slots: its instances may be re-labelled as ``cls``."""
    return type(f"_{cls.__name__}Twin", (), {"__slots__": cls.__slots__})  # type: ignore[attr-defined]  # slotted class


def fast_constructor(cls: type) -> Callable[..., Any]:
    """A function taking ``cls``'s fields (positionally or by name, defaults as declared) that builds
    the same instance as ``cls(...)``, faster. Only for frozen dataclasses with ``slots=True`` and no
    ``__post_init__``."""
    params = dataclasses.fields(cls)
    if not hasattr(cls, "__slots__") or hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__}: fast constructors need slots and no __post_init__")
    namespace: dict[str, Any] = {"_new": object.__new__, "_twin": layout_twin(cls), "_cls": cls}
    signature = []
    for f in params:
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            signature.append(f"{f.name}=_default_{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{f.name}: default factories are not supported")
        else:
            signature.append(f.name)
    body = "".join(f"    o.{f.name} = {f.name}\n" for f in params)
    source = (f"def make_{cls.__name__}({', '.join(signature)}):\n    o = _new(_twin)\n{body}"
              "    o.__class__ = _cls\n    return o\n")
    exec(source, namespace)  # the dataclasses module builds __init__ the same way
    return namespace[f"make_{cls.__name__}"]  # type: ignore[no-any-return]  # built by exec above
