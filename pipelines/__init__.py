"""Runnable beam_dp jobs (each a small CLI on Beam PipelineOptions).

Run as ``python -m pipelines.<job>``, a Ctrl-C while the job's modules are still loading is one line
and exit code 130 (:mod:`beam_dp.loading`). Importing the package otherwise changes nothing."""

from beam_dp.loading import install_while_loading

install_while_loading("pipelines")
