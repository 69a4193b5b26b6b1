"""The error a user fixes by changing a flag or a file (every job's command line prints it as one line, exit 2)."""

from __future__ import annotations

__all__ = ["UsageError"]


class UsageError(Exception):
    """Something the user fixes by changing a flag or a file; printed as one line, exit code 2."""
