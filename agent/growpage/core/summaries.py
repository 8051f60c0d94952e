"""Dual-timescale attention summaries, one row per running request, updated on the device.

STS (short term): a ring of the last ``sts_window_steps`` observations, each the attention mass of
the newest query per position bin (``sts_num_bins`` equal ranges of the request's logical length),
stored as uint8 (mass * 255). A bin is *active* when its mean mass over the window is at least
``sts_active_mass``; density = active bins / bins.

LTS (long term): mean attention entropy (nats) of the newest query, summed over
``lts_update_interval_steps`` steps, then folded into an EMA whose time constant is
``lts_window_steps``. The EMA starts at 0, so readings are bias-corrected (Adam-style:
``ema / (1 - decay ** updates)``): a constant-entropy stream reads as that entropy from the first
update. Before the first update the reading is the running mean of the partial interval.

``observe`` and ``reset`` are a handful of batched tensor ops with no host synchronisation;
``read`` synchronises (the reference engine reads at page boundaries), ``read_later`` does not (the
vLLM observer collects its readings a step later).
"""

from __future__ import annotations

import dataclasses

import torch

from growpage.config import GrowPageConfig
from growpage.core.devices import HostCopy, to_device


@dataclasses.dataclass(frozen=True)
class SummaryReading:
    """What the policy sees of one request's summaries."""

    sts_density: float
    lts_entropy: float
    steps_observed: int


class SummaryBank:
    """STS/LTS state for up to ``max_requests`` requests, addressed by row.

    Per row: the STS ring ``[W, B]`` uint8, a step counter (int64), and the LTS registers (EMA,
    interval sum: float32; updates, interval steps: int32). ``config.summary_bytes_per_request``
    states the total (280 bytes with the defaults, well under a 2 KB per-request budget).
    """

    def __init__(self, config: GrowPageConfig, max_requests: int, device: torch.device | str = "cpu"):
        self.config = config
        self.device = torch.device(device)
        self.max_requests = max_requests
        window, bins = config.sts_window_steps, config.sts_num_bins
        self.sts_ring = torch.zeros(max_requests, window, bins, dtype=torch.uint8, device=self.device)
        self.steps = torch.zeros(max_requests, dtype=torch.int64, device=self.device)
        self.lts_ema = torch.zeros(max_requests, dtype=torch.float32, device=self.device)
        self.lts_updates = torch.zeros(max_requests, dtype=torch.int32, device=self.device)
        self.interval_sum = torch.zeros(max_requests, dtype=torch.float32, device=self.device)
        self.interval_steps = torch.zeros(max_requests, dtype=torch.int32, device=self.device)

    def bytes_per_request(self) -> int:
        """Measured bytes of one row across all summary tensors."""
        tensors = (self.sts_ring, self.steps, self.lts_ema, self.lts_updates, self.interval_sum,
                   self.interval_steps)
        return sum(t[0].numel() * t.element_size() for t in tensors)

    def reset(self, rows: torch.Tensor | list[int]) -> None:
        """Clear rows for new requests."""
        rows = rows.to(self.device) if isinstance(rows, torch.Tensor) else to_device(list(rows), self.device)
        for tensor in (self.sts_ring, self.steps, self.lts_ema, self.lts_updates, self.interval_sum,
                       self.interval_steps):
            tensor[rows] = 0

    def observe(self, rows: torch.Tensor, bin_mass: torch.Tensor, entropy: torch.Tensor) -> None:
        """Fold one decode step's observation into each row, without a host sync.

        Args:
            rows: ``[N]`` long, distinct summary rows.
            bin_mass: ``[N, bins]`` attention mass per position bin (rows sum to ~1).
            entropy: ``[N]`` mean attention entropy of the newest query, nats.
        """
        window = self.config.sts_window_steps
        cursor = self.steps[rows] % window
        quantized = torch.round(bin_mass.float().clamp(0.0, 1.0) * 255.0).to(torch.uint8)
        self.sts_ring[rows, cursor] = quantized
        self.steps[rows] += 1

        interval_sum = self.interval_sum[rows] + entropy.float()
        interval_steps = self.interval_steps[rows] + 1
        due = interval_steps >= self.config.lts_update_interval_steps
        decay = self.config.lts_ema_decay
        interval_mean = interval_sum / interval_steps.clamp_min(1).float()
        self.lts_ema[rows] = torch.where(due, decay * self.lts_ema[rows] + (1 - decay) * interval_mean,
                                         self.lts_ema[rows])
        self.lts_updates[rows] += due.to(torch.int32)
        self.interval_sum[rows] = torch.where(due, torch.zeros_like(interval_sum), interval_sum)
        self.interval_steps[rows] = torch.where(due, torch.zeros_like(interval_steps), interval_steps)

    def read(self, rows: list[int]) -> list[SummaryReading]:
        """Host-side readings for ``rows`` (one device sync for all of them)."""
        if not rows:
            return []
        return readings_from(self.packed_readings(rows).cpu().tolist())

    def read_later(self, rows: list[int]) -> HostCopy:
        """:meth:`read` without waiting: the readings' copy to the host, started now; turn it into
        readings with :func:`readings_from` once it is ready (the observer's path)."""
        return HostCopy(self.packed_readings(rows))

    def packed_readings(self, rows: list[int]) -> torch.Tensor:
        """``[N, 3]`` (STS density, LTS entropy, steps observed) of ``rows``, on the device."""
        index = to_device(rows, self.device)
        window = self.config.sts_window_steps
        steps = self.steps[index]
        filled = steps.clamp(max=window)
        ring = self.sts_ring[index].float() / 255.0  # [N, W, B]
        valid = (torch.arange(window, device=self.device)[None, :] < filled[:, None]).float()
        mean_mass = (ring * valid[:, :, None]).sum(1) / filled.clamp_min(1)[:, None].float()
        active = (mean_mass >= self.config.sts_active_mass - 1e-6).sum(1).float()
        density = torch.where(filled > 0, active / self.config.sts_num_bins, torch.zeros_like(active))

        updates = self.lts_updates[index].float()
        corrected = self.lts_ema[index] / (1.0 - self.config.lts_ema_decay ** updates).clamp_min(1e-12)
        partial = self.interval_sum[index] / self.interval_steps[index].clamp_min(1).float()
        lts = torch.where(updates > 0, corrected, partial)
        return torch.stack((density, lts, steps.float()), dim=1)


def readings_from(packed: list[list[float]]) -> list[SummaryReading]:
    """Readings from :meth:`SummaryBank.packed_readings` once on the host."""
    return [SummaryReading(sts_density=d, lts_entropy=e, steps_observed=int(s)) for d, e, s in packed]


def summarize_attention(probs: torch.Tensor, key_positions: torch.Tensor, logical_lengths: torch.Tensor,
                        num_bins: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn the newest query's attention into an STS histogram row and an entropy.

    Args:
        probs: ``[N, heads, K]`` attention probabilities (0 on padded keys).
        key_positions: ``[N, K]`` logical positions of the keys (-1 on padding).
        logical_lengths: ``[N]`` tokens the request has seen (bins split ``[0, length)``).
        num_bins: STS bins.

    Returns:
        ``(bin_mass [N, bins], entropy [N])``: head-averaged mass per bin and mean entropy in nats.
    """
    probs = probs.float()
    token_mass = probs.mean(dim=1)  # [N, K]
    valid = key_positions >= 0
    lengths = logical_lengths.clamp_min(1)[:, None]
    bins = (key_positions.clamp_min(0).long() * num_bins // lengths).clamp_(0, num_bins - 1)
    bin_mass = torch.zeros(probs.shape[0], num_bins, dtype=torch.float32, device=probs.device)
    bin_mass.scatter_add_(1, bins, torch.where(valid, token_mass, torch.zeros_like(token_mass)))
    entropy = -(probs * torch.log(probs.clamp_min(1e-12))).sum(-1).mean(-1)
    return bin_mass, entropy
