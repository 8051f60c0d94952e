"""KV cache events stay true under compaction: a ``kv_aware`` router never believes in a block GrowPage rewrote.

vLLM publishes ``BlockStored`` when a full block enters its prefix cache and ``BlockRemoved`` when a
hash leaves it. GrowPage's compaction unhashes every block it rewrites or frees through the block
pool's own ``_maybe_evict_cached_block`` (which emits ``BlockRemoved``) before ``free_blocks``, so no
emission of GrowPage's own is needed. This test proves it on a real engine (``kv_events_runner.py``,
about 40 s): every request is compacted at least once, and the hashes a subscriber reading the ZMQ
stream believes cached are exactly the engine's prefix cache at the end. Were a compaction to drop a
hash silently, the subscriber would still hold it (and a router would send that prefix to this pod).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.vllm_guard import require_vllm_plugin

require_vllm_plugin()

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def events(prepared_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("kv-events")
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_PLUGINS="growpage", VLLM_LOGGING_LEVEL="WARNING")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    runner = Path(__file__).with_name("kv_events_runner.py")
    done = subprocess.run([sys.executable, str(runner), str(prepared_model_dir), str(tmp)], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("GROWPAGE_KV_EVENTS ")]
    assert done.returncode == 0 and lines, f"the engine run failed:\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
    return json.loads(lines[-1].removeprefix("GROWPAGE_KV_EVENTS "))


def test_every_request_finished_and_was_compacted(events):
    assert events["generated"] == [72] * 4
    assert events["compactions"] >= 4  # one per request at least: each passed the 2-block cap


def test_blocks_compaction_dropped_were_published_as_removed(events):
    counts = events["counts"]
    # the pool is far larger than the batch, so vLLM never evicted a cached block to reuse it: the
    # removals are the compactions'
    assert counts["stored"] > 0 and counts["removed"] > 0 and counts["cleared"] == 0
    assert counts["removed_unknown"] == 0  # nothing removed that was not first stored


def test_the_router_view_is_exactly_the_engines_prefix_cache(events):
    assert events["engine_cached"], "the shared prefix block stays cached"
    assert events["router_live"] == events["engine_cached"]
