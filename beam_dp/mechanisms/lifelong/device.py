"""Torch device selection: CUDA when it is available and allowed, else the CPU."""

from __future__ import annotations

import logging

import torch

__all__ = ["select_device", "set_threads"]

log = logging.getLogger(__name__)


def select_device(preference: str = "auto") -> torch.device:
    """``"auto"``: CUDA if available, else CPU; ``"cpu"``: always the CPU; ``"cuda"``: CUDA or ValueError."""
    if preference not in ("auto", "cpu", "cuda"):
        raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {preference!r}")
    if preference == "cpu":
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda")
    if preference == "cuda":
        raise ValueError("device='cuda' was requested but CUDA is not available")
    return torch.device("cpu")


def set_threads(n: int | None) -> None:
    """Limit torch's intra-op threads (small networks on shared cores train faster with 1)."""
    if n is not None:
        torch.set_num_threads(int(n))
