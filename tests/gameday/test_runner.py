"""The game day runner's own judgement: when a page still open from before counts as paging on a
scenario's data, what the timeline says about a page that does not come, and that each run starts
from empty Prometheus and Alertmanager state."""

from __future__ import annotations

from pathlib import Path

from growpage.gameday.runner import GamedaySettings, _Day, _stack, pair_firing_on_data_since
from growpage.gameday.scenarios import TTFT_FAST

FAST_PAIR = {"alertname": "GrowPageVLLMTimeToFirstTokenFastBurn", "long_window": "1h", "short_window": "5m"}
SLOW_PAIR = {**FAST_PAIR, "long_window": "6h", "short_window": "30m"}
SCALE = 1 / 60  # the game day's: a 5m window reads 5 s, 30m reads 30 s


def test_a_pair_counts_only_once_its_short_window_and_base_rate_hold_nothing_from_before():
    replaced = 1000.0
    # 30m pair at 1/60: 30 s short window + the 5 s base rate it sums
    assert pair_firing_on_data_since([SLOW_PAIR], replaced, replaced + 34.0, SCALE) == ""
    assert pair_firing_on_data_since([SLOW_PAIR], replaced, replaced + 35.0, SCALE) == "6h/30m"
    # the 5m pair clears its 5 s + 5 s first
    assert pair_firing_on_data_since([SLOW_PAIR, FAST_PAIR], replaced, replaced + 12.0, SCALE) == "1h/5m"
    # at the real windows nothing from the storm has left a 30-minute window after 35 s
    assert pair_firing_on_data_since([SLOW_PAIR, FAST_PAIR], replaced, replaced + 35.0, 1.0) == ""
    assert pair_firing_on_data_since([{"alertname": "GrowPageAgentDown"}], replaced, replaced + 1e6, SCALE) == ""


def test_a_run_in_a_used_workdir_starts_from_empty_prometheus_and_alertmanager_state(tmp_path):
    leftovers = [tmp_path / "prometheus" / "data" / "old-block", tmp_path / "alertmanager" / "am-data" / "nflog"]
    for path in leftovers:
        path.parent.mkdir(parents=True)
        path.write_text("from the last run")
    settings = GamedaySettings()
    with _stack(settings, tmp_path) as (prometheus, receiver):
        assert prometheus.query('ALERTS') == []
        assert not any(path.exists() for path in leftovers)
        # what a miss notes, read from the shipped rules on the real Prometheus: no pod, so no ratio
        day = _Day(settings, tmp_path, prometheus, receiver, Path("unused"), log=lambda line: None)
        view = day._burn_view(TTFT_FAST, settings.mixin.thresholds.vllm_latency_slos[0])
        assert view == (f"{TTFT_FAST}: 1h/5m inactive (ratios none/none, limit 0.144); "
                        "6h/30m inactive (ratios none/none, limit 0.060); vLLM scrapes up over the last minute: none")
    # Prometheus gone: the note says so, the game day goes on to its verdict
    gone = day._burn_view(TTFT_FAST, settings.mixin.thresholds.vllm_latency_slos[0])
    assert gone.startswith(f"{TTFT_FAST}: Prometheus did not answer the view (")
