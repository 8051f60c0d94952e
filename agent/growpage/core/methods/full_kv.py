"""vLLM's paging as a method: grow while the pool has a page, else preempt; no reservation, no
compression (the base class's hooks)."""

from __future__ import annotations

from growpage.core.methods.base import KVMethod, register

register("full_kv", lambda seed: KVMethod("full_kv", family="full"))
