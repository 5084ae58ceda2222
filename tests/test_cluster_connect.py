"""Which cluster `connect(None)` (every command's default, no --address) uses: the one
RAY_ADDRESS names when it is set, else a new local cluster, never one that `ray start` left
running on the machine (which `ray.init()` without an address would join). Checked on real
clusters, the driver in a subprocess so the shared test session is left alone."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CONNECT = """
import json, ray
from embedlab.sweep.cluster import connect
lines = []
connect(None, progress=lines.append)
print("RESULT " + json.dumps({"gcs": ray.get_runtime_context().gcs_address, "lines": lines}))
"""


def _connect(env: dict[str, str]) -> dict:
    done = subprocess.run([sys.executable, "-c", CONNECT], env=env, capture_output=True, text=True, timeout=240)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


@pytest.mark.ray
def test_the_default_is_ray_address_else_a_new_local_cluster(ray_session):
    """With the session's cluster recorded where `ray start` records the machine's latest
    cluster (Ray's temp dir), the default still starts a cluster of its own; with RAY_ADDRESS
    naming the session's cluster, it joins that one and says why."""
    import ray

    session = ray.get_runtime_context().gcs_address
    # Short: Ray's socket paths under its temp dir must fit in 107 characters.
    temp = Path(tempfile.mkdtemp(prefix="elc-", dir="/tmp"))
    try:
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text(session)  # what `ray start` leaves for ray.init()
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_TMPDIR"] = str(temp)
        fresh = _connect(env)
        assert fresh["gcs"] != session and "ray: starting a local cluster" in fresh["lines"]
        joined = _connect({**env, "RAY_ADDRESS": session})
        assert joined["gcs"] == session and f"ray: connecting to {session} (RAY_ADDRESS)" in joined["lines"]
    finally:
        shutil.rmtree(temp, ignore_errors=True)
