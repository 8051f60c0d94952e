"""``gpctl calibrate``: the rollout's monitoring phase, made operational.

Monitor mode exports the distributions GrowPage's thresholds cut: LTS entropy at request finish,
STS density at boundary decisions, request sizes. Calibration reads them over a window (a live
agent, Prometheus, or saved snapshots) and writes a config file with each threshold at a stated
quantile, the evidence in its header. Layers, one direction: ``sources`` -> :class:`Evidence` ->
pure ``thresholds`` -> :class:`Calibration` -> ``output`` (YAML, JSON). See ``docs/CALIBRATE.md``.
"""

from growpage.calibrate.evidence import Evidence, ModelEvidence
from growpage.calibrate.output import check_writable, render_yaml, to_json, write_config
from growpage.calibrate.request import DEFAULT_OUTPUT, CalibrateRequest, run
from growpage.calibrate.thresholds import DEFAULT_MIN_SAMPLES, Calibration, Quantiles, Setting, calibrate

__all__ = [
    "DEFAULT_MIN_SAMPLES", "DEFAULT_OUTPUT", "CalibrateRequest", "Calibration", "Evidence", "ModelEvidence",
    "Quantiles", "Setting", "calibrate", "check_writable", "render_yaml", "run", "to_json", "write_config",
]
