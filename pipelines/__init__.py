"""Runnable beam_dp jobs (each a small CLI on Beam PipelineOptions), run as ``python -m pipelines.<job>``.

Importing the package changes nothing in the host process (signals, logging): a job's command sets up
its logs and its signal handling when it runs (:func:`beam_dp.cli.guarded`, :mod:`pipelines.runner`)."""
