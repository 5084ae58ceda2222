"""Safe defaults: a local Ray head listens on loopback with token authentication on, and the
code base loads no pickles, unsafe YAML or shell strings, and stages no file under a fixed name."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SOURCES = [p for d in ("platform", "ablations", "workers", "dashboards") for p in (ROOT / d).rglob("*.py")]


def test_local_cluster_binds_loopback_with_token_auth(ray_session):
    """The GCS and the dashboard of the cluster `connect(None)` starts are on 127.0.0.1, and
    Ray's token authentication is on."""
    import ray
    import ray._private.worker as worker
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    assert ray.get_runtime_context().gcs_address.startswith("127.0.0.1:")
    assert worker.global_worker.node.address_info["webui_url"].startswith("127.0.0.1:")
    assert is_token_auth_enabled()


def test_disabled_auth_is_refused(monkeypatch):
    """Starting a local cluster with RAY_AUTH_MODE=disabled is refused before Ray starts."""
    from embedlab.sweep.cluster import require_token_auth

    require_token_auth()
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with pytest.raises(ConnectionError, match="token authentication"):
        require_token_auth()


@pytest.mark.parametrize("pattern, why", [
    (r"shell\s*=\s*True", "no shell strings: arguments go as lists"),
    (r"yaml\.load\(", "YAML only through yaml.safe_load"),
    (r"\bpickle\b|\bcloudpickle\b", "weights and state never go through pickle"),
    (r"torch\.load\((?![^)]*weights_only\s*=\s*True)", "torch.load only with weights_only=True"),
    (r"with_suffix\(\s*[\"']\.tmp[\"']\s*\)",
     "concurrent writers stage under names of their own (pid + random suffix), never one fixed .tmp"),
])
def test_no_unsafe_loading_in_the_code_base(pattern, why):
    """Every source file under platform/, ablations/, workers/ and dashboards/ is free of it."""
    offenders = []
    for path in SOURCES:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(pattern, code) and not code.strip().startswith(('"""', "'")):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, f"{why}:\n" + "\n".join(offenders)
