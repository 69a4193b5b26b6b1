"""Runnable beam_dp jobs (each a small CLI on Beam PipelineOptions)."""
