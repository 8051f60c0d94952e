"""``gpctl calibrate``'s rollout recommendation from monitor's forecast of enforce: the verdicts, where
the forecast comes from (expositions, snapshots, Prometheus queries) and where it is written."""

from __future__ import annotations

import dataclasses
import json

from test_calibrate_units import model  # the evidence helper of the calibrate tests

from growpage import catalog
from growpage.calibrate import Evidence, Quantiles, calibrate, render_yaml
from growpage.calibrate.evidence import evidence_from_expositions
from growpage.calibrate.output import to_json
from growpage.diagnose.exposition import parse_exposition
from growpage.diagnose.observations import Window
from growpage.rollout import (
    ENFORCE,
    ENFORCE_COST_FACTOR,
    NO_FORECAST,
    STAY_IN_MONITOR,
    ForecastEvidence,
    recommend,
)


def test_enforce_is_recommended_only_where_it_would_avoid_preemptions():
    avoids = recommend(ForecastEvidence(pages_freed=120, compactions=80, preemptions=10, preemptions_avoidable=8),
                       "monitor")
    assert avoids.verdict == ENFORCE and "8 of vLLM's 10 preemptions (80%)" in avoids.reason
    trims = recommend(ForecastEvidence(pages_freed=50, compactions=40, preemptions=0, preemptions_avoidable=0),
                      "monitor")
    assert trims.verdict == STAY_IN_MONITOR and "max_num_seqs" in trims.reason
    idle = recommend(ForecastEvidence(0, 0, 0, 0), "monitor")
    assert idle.verdict == STAY_IN_MONITOR and "not what limits" in idle.reason
    none = recommend(None, "enforce")
    assert none.verdict == NO_FORECAST and "runs enforce" in none.reason and none.forecast is None


def _exposition(time_s: float, freed: float, avoidable: float, preemptions: float):
    lines = []
    for spec, value in ((catalog.FORECAST_PAGES_FREED, freed), (catalog.FORECAST_COMPACTIONS, freed),
                        (catalog.FORECAST_PREEMPTIONS, preemptions),
                        (catalog.FORECAST_PREEMPTIONS_AVOIDABLE, avoidable)):
        lines += [f"# TYPE {spec.name.removesuffix('_total')} counter", f'{spec.name}{{model_name="m"}} {value}']
    lines += ["# TYPE growpage_build_info gauge",
              'growpage_build_info{model_name="m",mode="monitor",block_size="16"} 1']
    return parse_exposition("\n".join(lines) + "\n", "agent", time_s)


def test_the_forecast_is_the_counters_increase_over_the_window():
    evidence = evidence_from_expositions([_exposition(100.0, 10, 1, 4), _exposition(160.0, 70, 6, 9)],
                                         {"kind": "snapshot", "target": "a, b"}, "snapshots")
    assert evidence.models["m"].forecast == ForecastEvidence(60.0, 60.0, 5.0, 5.0)
    lifetime = evidence_from_expositions([_exposition(160.0, 70, 6, 9)], {"kind": "snapshot"}, "snapshots")
    assert lifetime.models["m"].forecast == ForecastEvidence(70.0, 70.0, 9.0, 6.0)


def test_what_monitor_cost_vllm_is_read_beside_the_forecast_and_named_in_every_reason():
    cost = [f"# TYPE {spec.name.removesuffix('_total')} counter\n"
            + "".join(f'{spec.name}{{model_name="m",side="{side}"}} {value}\n' for side, value in sides)
            for spec, sides in ((catalog.VLLM_OWN_SECONDS, (("scheduler", 1.0), ("worker", 2.0))),
                                (catalog.VLLM_STEP_SECONDS, (("scheduler", 10.0), ("worker", 90.0))))]
    with_cost = parse_exposition("".join(cost), "agent", 160.0)
    plain = _exposition(160.0, 70, 6, 9)
    merged = dataclasses.replace(plain, samples=plain.samples + with_cost.samples)
    forecast = evidence_from_expositions([merged], {"kind": "snapshot"}, "snapshots").models["m"].forecast
    assert forecast.own_share == 0.03  # both sides: 3 s of GrowPage's own in 100 s of hooked vLLM calls
    for evidence in (forecast, ForecastEvidence(50, 40, 0, 0, own_share=0.03), ForecastEvidence(0, 0, 0, 0,
                                                                                                own_share=0.03)):
        assert "GrowPage's own code took 3.0% of vLLM's step time in monitor" in recommend(evidence, "monitor").reason
    assert "own code" not in recommend(ForecastEvidence(0, 0, 0, 0), "monitor").reason  # not exported: not said
    # the cost alone is no forecast: an enforcing pod serves it, and calibrate still says it has none
    alone = evidence_from_expositions([with_cost], {"kind": "snapshot"}, "snapshots")
    assert all(model.forecast is None for model in alone.models.values())


def test_an_agent_without_forecast_series_has_no_forecast():
    text = '# TYPE growpage_build_info gauge\ngrowpage_build_info{model_name="m",mode="enforce",block_size="16"} 1\n'
    evidence = evidence_from_expositions([parse_exposition(text, "agent", 1.0)], {"kind": "snapshot"}, "snapshots")
    assert evidence.models["m"].forecast is None


def test_the_recommendation_is_in_the_file_header_and_the_json():
    forecast = ForecastEvidence(pages_freed=30, compactions=20, preemptions=4, preemptions_avoidable=3)
    calibration = calibrate(model(forecast=forecast), Quantiles())
    assert calibration.rollout is not None and calibration.rollout.verdict == ENFORCE
    evidence = Evidence(source={"kind": "snapshot", "target": "x"}, window=Window(0.0, 60.0, "snapshots"),
                        models={"m": model(forecast=forecast)})
    text = render_yaml(calibration, evidence, "gpctl calibrate --snapshot x")
    assert "# Rollout (monitor's forecast of enforce): enforce: enforce would have avoided 3 of vLLM's 4" in text
    document = json.loads(to_json(calibration, evidence, "gpctl calibrate --snapshot x", None))
    assert document["rollout"]["verdict"] == ENFORCE and document["rollout"]["forecast"]["pages_freed"] == 30
    assert calibrate(model(), Quantiles()).rollout.verdict == NO_FORECAST


def test_growth_aware_admission_is_recommended_where_it_would_avoid_more_than_compression():
    thrash = ForecastEvidence(pages_freed=40, compactions=30, preemptions=12, preemptions_avoidable=2,
                              preemptions_avoidable_by_admission=9)
    advised = recommend(thrash, "monitor")
    assert advised.verdict == ENFORCE and advised.settings == {"admission": "after_preemption"}
    assert "growth-aware admission would have avoided 9" in advised.reason and "narrower batch" in advised.reason
    # compression alone avoids nothing, admission would: its saving is not priced and holding starts
    # narrows the batch (enforce with it 0.81-0.89x vLLM alone wherever measured): monitor stays, setting named
    only_admission = recommend(ForecastEvidence(40, 30, 12, 0, preemptions_avoidable_by_admission=5), "monitor")
    assert only_admission.verdict == STAY_IN_MONITOR and only_admission.settings == {}
    assert "growth-aware admission would have avoided 5" in only_admission.reason
    assert "try admission: after_preemption in one namespace" in only_admission.reason
    # the headline trace's monitor runs (seed 41): nothing saved by compression, 9 by admission, 4 % own
    seed41 = recommend(ForecastEvidence(0, 0, 9, 0, preemptions_avoidable_by_admission=9, own_share=0.042,
                                        recompute_seconds_avoidable=0.0, wider_batch_seconds=0.0,
                                        own_seconds=0.45), "monitor")
    assert seed41.verdict == STAY_IN_MONITOR and seed41.settings == {}
    # where compression avoids as many, vLLM's own admission stays (no setting)
    assert recommend(ForecastEvidence(40, 30, 12, 6, preemptions_avoidable_by_admission=4), "monitor").settings == {}
    calibration = calibrate(model(forecast=thrash), Quantiles())
    evidence = Evidence(source={"kind": "snapshot", "target": "x"}, window=Window(0.0, 60.0, "snapshots"),
                        models={"m": model(forecast=thrash)})
    header = render_yaml(calibration, evidence, "gpctl calibrate --snapshot x")
    assert header.count("set admission: after_preemption") == 1
    document = json.loads(to_json(calibration, evidence, "gpctl calibrate --snapshot x", None))
    assert document["rollout"]["settings"] == {"admission": "after_preemption"}


def test_enforce_is_recommended_only_where_the_time_it_saves_outweighs_growpages_own():
    # 3 short requests' recompute and a little width against 6 s of GrowPage's own: enforce would be slower
    slower = recommend(ForecastEvidence(pages_freed=14, compactions=14, preemptions=9, preemptions_avoidable=3,
                                        recompute_seconds_avoidable=0.12, wider_batch_seconds=0.3, own_seconds=6.0),
                       "monitor")
    assert slower.verdict == STAY_IN_MONITOR
    assert "3 of vLLM's 9 preemptions" in slower.reason and "slower than vLLM alone" in slower.reason
    assert "0.12 s of recompute, 0.3 s of a wider batch) is no more than 2x the 6 s" in slower.reason
    # a saving above monitor's own but within what enforce's compactions add: still slower
    close = recommend(ForecastEvidence(14, 14, 9, 3, recompute_seconds_avoidable=7.5, wider_batch_seconds=0.3,
                                       own_seconds=6.0), "monitor")
    assert close.verdict == STAY_IN_MONITOR and ENFORCE_COST_FACTOR == 2.0
    # long requests recomputed: the same count of preemptions pays
    dear = recommend(ForecastEvidence(14, 14, 9, 3, recompute_seconds_avoidable=12.5, wider_batch_seconds=0.3,
                                      own_seconds=6.0), "monitor")
    assert dear.verdict == ENFORCE and "is more than 2x the 6 s" in dear.reason
    # no preemption to avoid, but the spare pages run waiting requests in a wider batch (prompt-heavy work)
    wider = recommend(ForecastEvidence(40, 19, 0, 0, recompute_seconds_avoidable=0.0, wider_batch_seconds=9.0,
                                       own_seconds=2.0), "monitor")
    assert wider.verdict == ENFORCE and "would have run waiting requests beside vLLM's batch" in wider.reason
    # pages freed that would save less than they cost: the max_num_seqs advice, with the weighing
    trims = recommend(ForecastEvidence(40, 19, 0, 0, recompute_seconds_avoidable=0.0, wider_batch_seconds=0.5,
                                       own_seconds=2.0), "monitor")
    assert trims.verdict == STAY_IN_MONITOR and "max_num_seqs" in trims.reason and "no more than" in trims.reason
    # a GrowPage that exports no saving: the preemptions alone decide, as before
    assert recommend(ForecastEvidence(14, 14, 9, 3, own_seconds=6.0), "monitor").verdict == ENFORCE


def test_the_time_saved_and_spent_are_the_counters_increase_over_the_window():
    def exposition(time_s: float, recompute: float, wider: float, own: float):
        base = _exposition(time_s, 20, 3, 9)
        lines = []
        for spec, value in ((catalog.FORECAST_RECOMPUTE_SECONDS_AVOIDABLE, recompute),
                            (catalog.FORECAST_WIDER_BATCH_SECONDS, wider)):
            lines += [f"# TYPE {spec.name.removesuffix('_total')} counter", f'{spec.name}{{model_name="m"}} {value}']
        own_name = catalog.VLLM_OWN_SECONDS.name
        lines += [f"# TYPE {own_name.removesuffix('_total')} counter",
                  f'{own_name}{{model_name="m",side="scheduler"}} {own / 4}',
                  f'{own_name}{{model_name="m",side="worker"}} {own * 3 / 4}']
        extra = parse_exposition("\n".join(lines) + "\n", "agent", time_s)
        return dataclasses.replace(base, samples=base.samples + extra.samples)

    evidence = evidence_from_expositions([exposition(100.0, 1.0, 2.0, 4.0), exposition(160.0, 1.5, 5.0, 10.0)],
                                         {"kind": "snapshot"}, "snapshots")
    forecast = evidence.models["m"].forecast
    assert (forecast.recompute_seconds_avoidable, forecast.wider_batch_seconds, forecast.own_seconds) == (0.5, 3.0, 6.0)
    # an older GrowPage serves neither saving: nothing to weigh
    older = evidence_from_expositions([_exposition(160.0, 70, 6, 9)], {"kind": "snapshot"}, "snapshots")
    assert older.models["m"].forecast.recompute_seconds_avoidable is None
