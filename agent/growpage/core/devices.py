"""The devices the KV pages live on: their names (for ``growpage_build_info`` and diagnose) and
copies between host and device that never wait for the device (the observation path's).

Pure torch: the torch-only GPU checks import it without the rest of GrowPage.
"""

from __future__ import annotations

from typing import Any

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


def to_device(values: list[int], device: torch.device) -> torch.Tensor:
    """``values`` as a long tensor on ``device`` in one host-to-device copy that does not wait for
    the device: from pinned memory on CUDA, where a copy from pageable memory would block the host
    until the stream's earlier work is done."""
    host = torch.tensor(values, dtype=torch.long)
    if device.type == "cuda":
        host = host.pin_memory()
    return host.to(device, non_blocking=True)


class HostCopy:
    """A device tensor on its way to the host, read once it has landed: never waits for the device.

    On CUDA the copy goes into pinned memory without blocking and an event marks its end;
    :meth:`ready` asks the event (no synchronisation), so a reader polls at its next natural
    point (the next step) instead of stalling this one. Elsewhere the copy is done at once.
    """

    def __init__(self, tensor: torch.Tensor):
        self._event: Any = None
        if tensor.device.type == "cuda":
            self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
            self._host.copy_(tensor, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
        else:
            self._host = tensor.detach().clone()

    def ready(self) -> bool:
        """Whether the copy has landed (asks the device without waiting)."""
        return self._event is None or bool(self._event.query())

    def tolist(self) -> Any:
        """The values, once :meth:`ready` (raises before: reading early would return garbage)."""
        if not self.ready():
            raise RuntimeError("HostCopy read before the copy landed; check ready() first")
        return self._host.tolist()
