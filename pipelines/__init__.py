"""Runnable beam_dp jobs (each a small CLI on Beam PipelineOptions).

Run as ``python -m pipelines.<job>``, a Ctrl-C while the job's modules are still loading (the first
second or so, before ``beam_dp.cli.guarded`` takes over) is one line and exit code 130, like one
during the run, instead of an import traceback. Importing the package otherwise changes nothing."""

import os
import signal
import sys


def _interrupted_while_loading(signum, frame) -> None:
    argv = getattr(sys, "orig_argv", [])
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else "pipelines"
    sys.stderr.write(f"python -m {module}: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


_interrupted_while_loading.while_loading = True  # beam_dp.cli.guarded restores Ctrl-C as KeyboardInterrupt

if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_loading)  # only while `python -m` locates the job
