"""Names of the devices the KV pages live on (for ``growpage_build_info`` and diagnose)."""

from __future__ import annotations

import torch


def device_name(device: torch.device | str) -> str:
    """A human name of the device the pages live on: the GPU model on CUDA, else the device type."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_name(device)
        except Exception:  # a driver hiccup must not keep telemetry from starting
            return "cuda"
    return device.type
