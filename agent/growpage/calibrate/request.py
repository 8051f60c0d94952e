"""What the user asked for (one source, its options, the quantiles), validated, and running it."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

from growpage.calibrate import sources
from growpage.calibrate.evidence import Evidence
from growpage.calibrate.thresholds import DEFAULT_MIN_SAMPLES, Calibration, Quantiles, calibrate
from growpage.diagnose.sources.choice import require_modules, require_one_source
from growpage.errors import GrowPageError

DEFAULT_OUTPUT = Path("growpage-calibrated.yaml")
DEFAULT_SINCE_S = 1800.0


@dataclasses.dataclass(frozen=True)
class CalibrateRequest:
    """Exactly one of ``endpoint``, ``prometheus``, ``snapshots``; the rest tune the source and the choice.

    Attributes:
        duration_s: with ``endpoint``: scrape twice this far apart; ``None``: one scrape, the
            distributions since the agent started.
        since_s, at_s, namespace: with ``prometheus``: the window ``[at - since, at]`` (``at``
            defaults to now) and a ``namespace`` matcher.
        model_name: the model to calibrate (a matcher for Prometheus, a filter otherwise); required
            when the source holds several.
        block_size: overrides the build info's ``block_size``.
        output: the config file to write; ``dry_run`` writes nothing.
    """

    endpoint: str | None = None
    prometheus: str | None = None
    snapshots: tuple[Path, ...] = ()
    duration_s: float | None = None
    since_s: float = DEFAULT_SINCE_S
    at_s: float | None = None
    namespace: str | None = None
    model_name: str | None = None
    timeout_s: float = 10.0
    block_size: int | None = None
    quantiles: Quantiles = Quantiles()
    min_samples: int = DEFAULT_MIN_SAMPLES
    output: Path = DEFAULT_OUTPUT
    dry_run: bool = False

    def __post_init__(self) -> None:
        require_one_source(self.endpoint, self.prometheus, self.snapshots)
        if (self.namespace or self.at_s is not None) and not self.prometheus:
            raise GrowPageError("--namespace and --at go with --prometheus (an agent's own metrics carry no "
                                "namespace; use --model-name to pick a model)")
        if self.duration_s is not None and not self.endpoint:
            raise GrowPageError("--duration goes with --endpoint (with --prometheus the window is --since)")
        if isinstance(self.min_samples, bool) or not isinstance(self.min_samples, int) or self.min_samples < 1:
            raise GrowPageError(f"--min-samples must be a whole number >= 1, got {self.min_samples!r}; e.g. 50")
        if self.block_size is not None and (isinstance(self.block_size, bool) or not isinstance(self.block_size, int)
                                            or self.block_size < 1):
            raise GrowPageError(f"--block-size must be a whole number of tokens >= 1, got {self.block_size!r}; "
                                "e.g. 16")

    def command(self) -> str:
        """The ``gpctl calibrate`` command that repeats this request, for the file's header."""
        args = ["gpctl", "calibrate"]
        if self.endpoint:
            args += ["--endpoint", self.endpoint]
            if self.duration_s is not None:
                args += ["--duration", f"{self.duration_s:g}s"]
        elif self.prometheus:
            args += ["--prometheus", self.prometheus, "--since", f"{self.since_s:g}s"]
            if self.at_s is not None:
                args += ["--at", f"{self.at_s:.0f}"]
            if self.namespace:
                args += ["--namespace", self.namespace]
        else:
            args += ["--snapshot", *map(str, self.snapshots)]
        if self.model_name is not None:
            args += ["--model-name", self.model_name]
        if self.block_size is not None:
            args += ["--block-size", str(self.block_size)]
        defaults = Quantiles().options()
        for option, value in self.quantiles.options().items():
            if value != defaults[option]:
                args += [option, f"{value:g}"]
        if self.min_samples != DEFAULT_MIN_SAMPLES:
            args += ["--min-samples", str(self.min_samples)]
        args += ["--output", str(self.output)]
        return shlex.join(args)


def collect(request: CalibrateRequest) -> Evidence:
    """Read the requested source; raises GrowPageError with one line when it cannot."""
    require_modules("calibrate", reads_http=bool(request.endpoint or request.prometheus),
                    parses_expositions=not request.prometheus)
    if request.endpoint:
        return sources.from_endpoint(request.endpoint, request.duration_s, request.timeout_s)
    if request.prometheus:
        return sources.from_prometheus(request.prometheus, request.since_s, request.at_s, request.namespace,
                                       request.model_name, request.timeout_s)
    return sources.from_snapshots(request.snapshots)


def run(request: CalibrateRequest) -> tuple[Calibration, Evidence]:
    """Collect the distributions and choose the settings for the one model they describe.

    Raises:
        GrowPageError: the source cannot be read, or its distributions cannot support a choice.
    """
    evidence = collect(request)
    model = evidence.for_model(request.model_name)
    return (calibrate(model, request.quantiles, request.block_size, request.min_samples, evidence.where,
                      evidence.wider),
            evidence)
