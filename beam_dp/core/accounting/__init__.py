"""Accounting: the pure spend functions of every mechanism family, each a function of public parameters
returning ``(epsilon, delta)``. Mechanisms report their spend with them and releases declare them as
accounts (:data:`beam_dp.core.noise_declaration.ACCOUNT_KINDS`), so a verifier recomputes a release's
spend with the very function the mechanism used. One module per family: :mod:`.growing_db`,
:mod:`.regression`, :mod:`.erm` (and :mod:`.erm_log`, the spend re-derived from a release log),
:mod:`.lifelong`. No torch, no Beam; dp-accounting is imported on first use.
"""
