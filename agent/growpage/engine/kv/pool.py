"""Physical page accounting: which pages are free, reserved or used, and who shares them.

The pool knows nothing of tensors or requests' token order; it is the ledger the tests check under
random workloads: ``num_free + num_reserved + num_used == num_pages`` after every operation, and every
page comes back when its last holder releases it.
"""

from __future__ import annotations

import collections
import enum

from growpage.errors import GrowPageError


class PageState(enum.IntEnum):
    FREE = 0
    RESERVED = 1  # granted to a request, not written yet
    USED = 2  # holds KV


class PoolExhausted(GrowPageError):
    """Raised by ``reserve`` when called without a successful ``can_reserve`` first."""


class PagePool:
    """``num_pages`` physical pages with states, reference counts and prefix-cache hashes.

    Use check/commit pairs: ``can_reserve(n)`` then ``reserve(n)``. A page with more than one holder,
    or one published under a prefix hash, is *shared*: read-only, never compressed in place.
    """

    def __init__(self, num_pages: int):
        if num_pages < 1:
            raise GrowPageError(f"a page pool needs at least 1 page, got {num_pages}; "
                                "give the KV cache more memory or lower block_size")
        self.num_pages = num_pages
        self._state = [PageState.FREE] * num_pages
        self._ref_count = [0] * num_pages
        self._free: collections.deque[int] = collections.deque(range(num_pages))
        self._hash_of_page: dict[int, int] = {}
        self._page_of_hash: dict[int, int] = {}
        self.num_reserved = 0
        self.num_used = 0

    # ---- counts -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return len(self._free)

    def state(self, page: int) -> PageState:
        return self._state[page]

    def ref_count(self, page: int) -> int:
        return self._ref_count[page]

    def is_shared(self, page: int) -> bool:
        """True for pages that must never be rewritten in place (several holders or a hash)."""
        return self._ref_count[page] > 1 or page in self._hash_of_page

    # ---- grant and release --------------------------------------------------------------------
    def can_reserve(self, num_pages: int) -> bool:
        return 0 <= num_pages <= len(self._free)

    def reserve(self, num_pages: int) -> list[int]:
        """Move ``num_pages`` free pages to *reserved* for one holder."""
        if not self.can_reserve(num_pages):
            raise PoolExhausted(f"asked for {num_pages} pages with {len(self._free)} free")
        pages = [self._free.popleft() for _ in range(num_pages)]
        for page in pages:
            self._state[page] = PageState.RESERVED
            self._ref_count[page] = 1
        self.num_reserved += num_pages
        return pages

    def mark_used(self, page: int) -> None:
        """A reserved page received its first token."""
        assert self._state[page] is PageState.RESERVED, f"page {page} is {self._state[page].name}"
        self._state[page] = PageState.USED
        self.num_reserved -= 1
        self.num_used += 1

    def mark_reserved(self, page: int) -> None:
        """A used page was emptied by compaction but stays with its holder."""
        assert self._state[page] is PageState.USED and not self.is_shared(page)
        self._state[page] = PageState.RESERVED
        self.num_used -= 1
        self.num_reserved += 1

    def release(self, page: int) -> None:
        """Drop one holder; the last one returns the page to the free list."""
        assert self._ref_count[page] > 0, f"page {page} released more often than held"
        self._ref_count[page] -= 1
        if self._ref_count[page] > 0:
            return
        if self._state[page] is PageState.USED:
            self.num_used -= 1
        else:
            self.num_reserved -= 1
        self._state[page] = PageState.FREE
        block_hash = self._hash_of_page.pop(page, None)
        if block_hash is not None:
            del self._page_of_hash[block_hash]
        self._free.append(page)

    # ---- prefix sharing -----------------------------------------------------------------------
    def publish(self, page: int, block_hash: int) -> None:
        """Offer a full, used page to later requests with the same prefix (read-only from now)."""
        assert self._state[page] is PageState.USED
        if block_hash in self._page_of_hash or page in self._hash_of_page:
            return
        self._hash_of_page[page] = block_hash
        self._page_of_hash[block_hash] = page

    def lookup(self, block_hash: int) -> int | None:
        return self._page_of_hash.get(block_hash)

    def share(self, page: int) -> None:
        """One more holder of a published page."""
        assert self._state[page] is PageState.USED and page in self._hash_of_page
        self._ref_count[page] += 1

    def check_invariants(self) -> None:
        """Raise AssertionError if the ledger is inconsistent (used by tests and debug builds)."""
        free = set(self._free)
        assert len(free) == len(self._free), "a page is on the free list twice"
        counts = collections.Counter(self._state)
        assert counts[PageState.FREE] == len(free)
        assert counts[PageState.RESERVED] == self.num_reserved
        assert counts[PageState.USED] == self.num_used
        assert len(free) + self.num_reserved + self.num_used == self.num_pages
        for page in range(self.num_pages):
            held = self._ref_count[page] > 0
            assert held == (page not in free), f"page {page}: refcount {self._ref_count[page]}"
        for page in self._hash_of_page:
            assert self._state[page] is PageState.USED
