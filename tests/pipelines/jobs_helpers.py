"""Shared checks of the job tests: dead letters by stage and reason, one-line usage errors."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest


class FakeSecretManager:
    """Answers ``access_secret_version`` like google-cloud-secret-manager; records the names asked for
    (install it with ``monkeypatch.setattr(beam_dp.io.keys, "secret_manager_client", lambda: fake)``)."""

    def __init__(self, payload: bytes):
        self.payload, self.asked = payload, []

    def access_secret_version(self, request):
        self.asked.append(request["name"])
        return SimpleNamespace(payload=SimpleNamespace(data=self.payload))


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` -> sha256 of its bytes (byte-for-byte comparison)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def wait_for(path_glob: str, folder: Path, proc: subprocess.Popen, seconds: float = 120) -> None:
    """Wait until ``folder`` holds a match of ``path_glob`` while ``proc`` runs (fails if it ended)."""
    deadline = time.monotonic() + seconds
    while not list(folder.glob(path_glob)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path_glob} never appeared"
        time.sleep(0.05)


def dead_letters(out: Path) -> Counter:
    """``{"stage:reason": count}`` of the dead letters of a job run with ``--output=out``: in its raw-data
    folder ``<out>.private`` (never in ``out``)."""
    assert not list(out.glob("dead_letter-*")), "dead letters (raw data) under --output"
    private = out.with_name(out.name + ".private")
    letters = [json.loads(line) for f in private.glob("dead_letter-*") for line in f.read_text().splitlines() if line]
    return Counter(f"{d['stage']}:{d['reason']}" for d in letters)


def assert_usage_error(main, prog: str, argv: list[str], fix: str, capsys) -> None:
    """``main(argv)`` exits 2 with one line ``<prog>: error: ...`` naming ``fix``."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"{prog}: error:"), err
    assert fix in err, err


VALUE_REASONS = ("bad_value", "bad_dtype", "non_finite", "wrong_shape")


def value_reasons_merged(counts: Counter) -> Counter:
    """``stage:bad_input`` for every value-level reason (a family may refine which one applies)."""
    out: Counter = Counter()
    for key, n in counts.items():
        stage, reason = key.split(":", 1)
        out[f"{stage}:bad_input" if reason in VALUE_REASONS else key] += n
    return out


def user_functions(proto) -> bytes:
    """Every ParDo's DoFn and arguments in a Runner API pipeline, unpickled and pickled again without
    compression (Beam compresses them), so a test can search them for a secret."""
    import cloudpickle
    from apache_beam.internal import pickler
    from apache_beam.portability.api import beam_runner_api_pb2

    out = []
    for t in proto.components.transforms.values():
        if t.spec.urn == "beam:transform:pardo:v1":
            payload = beam_runner_api_pb2.ParDoPayload.FromString(t.spec.payload)
            out.append(cloudpickle.dumps(pickler.loads(payload.do_fn.payload)))
    return b"".join(out)
