"""Every node id in ``tests/long.txt`` names a test function that exists: a renamed or removed test would
otherwise leave a line that marks nothing (and a renamed long run back in CI's budget)."""

import re
from pathlib import Path

from tests.conftest import LONG

TESTS = Path(__file__).parent


def test_every_long_entry_names_an_existing_test_function():
    missing = []
    for node in sorted(LONG):
        path, _, name = node.partition("::")
        function = re.sub(r"\[.*$", "", name)
        source = TESTS.parent / path
        if not source.is_file() or not re.search(rf"^\s*def {re.escape(function)}\(", source.read_text(), re.M):
            missing.append(node)
    assert LONG and not missing, missing
