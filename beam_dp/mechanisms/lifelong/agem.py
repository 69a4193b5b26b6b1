"""A-GEM projection (Lai et al., "Lifelong DP: Consistently Bounded Differential Privacy in Lifelong Machine Learning"), per parameter block. Post-processing: no privacy cost."""

from __future__ import annotations

import torch

__all__ = ["project", "project_blocks"]


def project(g: torch.Tensor, g_ref: torch.Tensor, always: bool = False) -> torch.Tensor:
    """``g − (gᵀg_ref / g_refᵀg_ref) g_ref`` when ``gᵀg_ref < 0`` (or ``always``); else ``g``.

    ``g_ref = 0`` leaves ``g`` unchanged. After a projection ``g̃ᵀg_ref = 0`` up to rounding.
    """
    ref_sq = torch.dot(g_ref, g_ref)
    dot = torch.dot(g, g_ref)
    if ref_sq == 0 or (not always and dot >= 0):
        return g
    return g - (dot / ref_sq) * g_ref


def project_blocks(g: dict[str, torch.Tensor], g_ref: dict[str, torch.Tensor], blocks: list[tuple[str, ...]],
                   always: bool = False) -> dict[str, torch.Tensor]:
    """Project each block of named gradients on its own constraint; returns the new named gradients."""
    out: dict[str, torch.Tensor] = {}
    for names in blocks:
        flat = torch.cat([g[n].reshape(-1) for n in names])
        ref = torch.cat([g_ref[n].reshape(-1) for n in names])
        proj = project(flat, ref, always)
        offset = 0
        for n in names:
            size = g[n].numel()
            out[n] = proj[offset: offset + size].reshape(g[n].shape)
            offset += size
    return out
