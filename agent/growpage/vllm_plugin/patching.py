"""How GrowPage wraps vLLM's methods: once per process, each wrapper marked so a second install is a no-op.

Every hook module (scheduler, worker, front-end tracing) installs its wrappers through
:func:`wrap_methods` and asks :func:`is_wrapped` first, so ``register()`` running again in a forked
child, or a test installing hooks twice, never stacks a wrapper on a wrapper.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

WRAPPED_ATTRIBUTE = "__growpage_wrapped__"

# (the class or module that owns the method, its name, a factory: original -> wrapper)
WrapTarget = tuple[Any, str, Callable[[Any], Any]]


def is_wrapped(function: Any) -> bool:
    """Whether ``function`` is one of GrowPage's wrappers."""
    return bool(getattr(function, WRAPPED_ATTRIBUTE, False))


def wrap_methods(targets: Iterable[WrapTarget]) -> None:
    """Replace each ``owner.name`` by ``wrap(original)``, marked as GrowPage's."""
    for owner, name, wrap in targets:
        wrapper = wrap(getattr(owner, name))
        setattr(wrapper, WRAPPED_ATTRIBUTE, True)
        setattr(owner, name, wrapper)
