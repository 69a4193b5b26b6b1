"""A-GEM projection (Lai et al., "Lifelong DP: Consistently Bounded Differential Privacy in Lifelong Machine Learning"), per parameter block. Post-processing: no privacy cost.

Branch-free: the test ``gᵀg_ref < 0`` is a tensor, so a projection never waits for the device (no host
synchronisation inside a training step).
"""

from __future__ import annotations

import torch

__all__ = ["project", "project_blocks"]


def project(g: torch.Tensor, g_ref: torch.Tensor, always: bool = False) -> torch.Tensor:
    """``g − (gᵀg_ref / g_refᵀg_ref) g_ref`` when ``gᵀg_ref < 0`` (or ``always``); else ``g`` exactly.

    ``g_ref = 0`` leaves ``g`` unchanged. After a projection ``g̃ᵀg_ref = 0`` up to rounding. One fused
    expression: the coefficient is 0 where no projection applies.
    """
    ref_sq = torch.dot(g_ref, g_ref)
    dot = torch.dot(g, g_ref)
    apply = ref_sq > 0 if always else (ref_sq > 0) & (dot < 0)
    coef = torch.where(apply, dot / torch.where(ref_sq > 0, ref_sq, torch.ones_like(ref_sq)), torch.zeros_like(dot))
    return g - coef * g_ref


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
