"""The one device rule of every torch path (the ERM torch solver, PRIVINCREG's torch backend, the lifelong learners).

``"cpu"`` (default everywhere): the CPU, also when a GPU is present; ``"cuda"``: the GPU, refused
(``ValueError``) where torch sees none rather than silently changing device; ``"auto"``: CUDA when
present, else the CPU. :func:`check_device` validates a name at construction without importing torch;
:func:`resolve_device` decides on the worker, at run time (a job built without a GPU may ask for one).
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEVICES", "check_device", "resolve_device", "set_threads"]

DEVICES = ("cpu", "cuda", "auto")


def check_device(device: Any) -> str:
    """``device`` if it is one of :data:`DEVICES` (``ValueError`` otherwise); torch is not imported."""
    if not isinstance(device, str) or device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    return device


def resolve_device(device: Any = "cpu"):
    """The ``torch.device`` for ``device`` (a name of :data:`DEVICES` or a ``torch.device``)."""
    import torch

    if isinstance(device, torch.device):
        name = device.type
        check_device(name)
    else:
        name = check_device(device)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' but torch sees no CUDA device (use 'auto' to fall back to the CPU)")
    return device if isinstance(device, torch.device) else torch.device(name)


def set_threads(n: int | None) -> None:
    """Limit torch's intra-op threads (small networks on shared cores train faster with 1); ``None`` leaves them."""
    if n is not None:
        import torch

        torch.set_num_threads(int(n))
