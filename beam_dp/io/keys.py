"""Fetch the secret noise key on a worker: from a file on any Beam filesystem (``gs://``, local, ...),
from Google Secret Manager (``projects/P/secrets/S/versions/V``; needs the ``gcp`` extra,
``google-cloud-secret-manager``, imported only when used) or from an env var.

Only the key's *location* travels in the pipeline graph and its options; the bytes are read here,
in ``setup()`` of the DoFn that draws noise, and go straight into a ``NoiseSource`` (never pickled,
never logged). A retried or duplicated bundle then draws the same noise.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from beam_dp.core.noise import NoiseSource

__all__ = ["SECRET_VERSION", "is_secret_version", "load_noise_source", "read_key_file", "read_secret"]

#: A Secret Manager secret version resource name.
SECRET_VERSION = re.compile(r"^projects/[^/\s]+/secrets/[^/\s]+/versions/[^/\s]+$")


def is_secret_version(name: str) -> bool:
    return bool(SECRET_VERSION.match(name))


def read_key_file(path: str) -> bytes:
    """The key file's bytes, through Beam's FileSystems (any scheme)."""
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path) as fh:
        return fh.read()


def secret_manager_client() -> Any:
    """A Secret Manager client (application default credentials: on Dataflow, the worker service account)."""
    try:
        from google.cloud import secretmanager
    except ImportError:
        raise ImportError("reading the noise key from Secret Manager needs google-cloud-secret-manager: "
                          "pip install 'beam_dp[gcp]'") from None
    return secretmanager.SecretManagerServiceClient()


def read_secret(name: str, client_factory: Callable[[], Any] | None = None) -> bytes:
    """The payload of a Secret Manager secret version (hex text or raw key bytes, as a key file)."""
    if not is_secret_version(name):
        raise ValueError("a noise key secret must be a version resource projects/P/secrets/S/versions/V")
    client = (client_factory or secret_manager_client)()
    return bytes(client.access_secret_version(request={"name": name}).payload.data)


def load_noise_source(env_var: str | None, key_file: str | None, secret: str | None) -> NoiseSource:
    """The worker's ``NoiseSource``: the secret wins, then the key file, then the env var (the commands
    accept one source at most: ``pipelines.common.check_key_sources``). A secret or key file holds hex
    text of at least 64 hex digits or at least 32 raw bytes (``beam_dp.core.noise.load_key``); a named
    source that is missing or unusable is a ``ValueError``; only with none named and the default env var
    unset is a random key drawn (logged as not reproducible, see ``NoiseSource.from_config``)."""
    if secret:
        return NoiseSource.from_config(env_var, secret, lambda name: read_secret(name))
    return NoiseSource.from_config(env_var, key_file, read_key_file)
