"""The header every benchmark report carries (machine, load, command), printed and optionally appended to a
Markdown file."""

from __future__ import annotations

import os
import platform
import sys


def emit_report(lines: list[str], out: str | None) -> str:
    """Print ``lines`` under the machine and command header; append the text to ``out`` when given."""
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"
    text = (f"\nMachine: {machine}; load average at the end {os.getloadavg()[0]:.1f}\n\n"
            f"Command: `{' '.join(['python'] + sys.argv)}`\n\n" + "\n".join(lines) + "\n")
    print(text)
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(text)
    return text


def machine_comment() -> str:
    """One ``# ...`` line: the platform, cores, Python, numpy, the load and which beam_dp checkout runs."""
    import numpy as np

    import beam_dp

    root = os.path.dirname(os.path.dirname(os.path.abspath(beam_dp.__file__)))
    return (f"# {platform.platform()}; {platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}, "
            f"numpy {np.__version__}; load {os.getloadavg()[0]:.1f}; beam_dp at {root}")
