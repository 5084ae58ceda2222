"""The private Ray symbols embedlab relies on still have the shape it relies on, only
embedlab.sweep.ray_compat touches private Ray paths, and the supported Ray versions are checked.
No Ray cluster is started: a Ray upgrade that breaks a hook fails here first."""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
from pathlib import Path

import pytest
import ray

from embedlab.sweep import ray_compat

ROOT = Path(__file__).parent.parent
COMPAT = ROOT / "platform" / "embedlab" / "sweep" / "ray_compat.py"
# A dotted Ray path with a private part: ray._private.x, ray.train._internal, ray._raylet ...
PRIVATE_RAY = re.compile(r"\bray(\.[A-Za-z]\w*)*\._(?!_)\w*")


def test_token_auth_hook_has_the_signature_embedlab_calls():
    """maybe_enable_token_auth_if_token_available still takes warn_if_disabled (a bool, default
    True), reads RAY_AUTH_MODE, and is what ray_compat hands out."""
    from ray._private.authentication import authentication_token_setup as setup

    parameters = inspect.signature(setup.maybe_enable_token_auth_if_token_available).parameters
    assert list(parameters) == ["warn_if_disabled"]
    assert parameters["warn_if_disabled"].default is True
    assert setup.AUTH_MODE_ENV_VAR == ray_compat.AUTH_MODE_ENV
    assert ray_compat.token_auth_hook() is setup.maybe_enable_token_auth_if_token_available


def test_single_machine_constant_is_a_bool_that_ray_reads_for_the_node_address():
    """ray_constants.ENABLE_RAY_CLUSTER is a bool from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER, and the
    function that picks the node's address still consults it (so setting it keeps loopback)."""
    import ray._private.ray_constants as ray_constants
    import ray._private.services as services

    assert ray_compat.single_machine_constants() is ray_constants
    assert isinstance(ray_constants.ENABLE_RAY_CLUSTER, bool)
    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == ray_compat.SINGLE_MACHINE_ENV
    assert "ray_constants.ENABLE_RAY_CLUSTER" in inspect.getsource(services.get_node_ip_address)


def test_a_missing_private_symbol_is_refused_naming_the_versions(monkeypatch):
    """With the constant gone, the hook raises RayIncompatible naming the installed Ray and the
    supported range, instead of setting an attribute Ray no longer reads."""
    import ray._private.ray_constants as ray_constants

    monkeypatch.delattr(ray_constants, "ENABLE_RAY_CLUSTER")
    with pytest.raises(ray_compat.RayIncompatible, match=re.escape(f"Ray {ray.__version__}") + ".*"
                       + re.escape(ray_compat.SUPPORTED_RAY)):
        ray_compat.force_single_machine_mode()


def test_an_explicit_auth_mode_is_left_to_ray(monkeypatch):
    """With RAY_AUTH_MODE set by the user, the private hook is not called at all."""
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setattr(ray_compat, "token_auth_hook", lambda: pytest.fail("private hook called"))
    assert ray_compat.enable_token_auth_from_local_token() is True


def _private_ray_uses(path: Path) -> list[str]:
    """`line: path` for each import, attribute chain or string in the module that names a private Ray path."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Attribute):
            parts, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                names = [".".join([value.id, *reversed(parts)])]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names = [node.value]
        found += [f"{node.lineno}: {match.group(0)}" for name in names for match in PRIVATE_RAY.finditer(name)]
    return sorted(set(found))


def test_only_ray_compat_names_private_ray_paths():
    """No module under platform/ but ray_compat.py imports, reaches or mentions ray._private,
    ray.*._internal or another underscored Ray path; ray_compat.py itself does (the scan works)."""
    offenders = {str(path.relative_to(ROOT)): uses for path in sorted((ROOT / "platform").rglob("*.py"))
                 if path != COMPAT and (uses := _private_ray_uses(path))}
    assert not offenders, offenders
    assert _private_ray_uses(COMPAT)


def test_the_installed_and_pinned_ray_are_supported():
    """The installed Ray and the one pyproject.toml pins are both in SUPPORTED_RAY."""
    assert ray_compat.check_ray_version() is None
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = next(d for d in dependencies if d.startswith("ray[")).split("==", 1)[1]
    assert ray_compat.check_ray_version(pinned) is None


@pytest.mark.parametrize("version", ["2.59.1", "2.61.0", "3.0.0", "not-a-version"])
def test_a_ray_outside_the_range_is_refused_unless_allowed(version, monkeypatch):
    """Outside SUPPORTED_RAY: refused naming the version, the range and the override; with
    EMBEDLAB_ALLOW_UNTESTED_RAY=1 a warning line instead."""
    monkeypatch.delenv(ray_compat.ALLOW_UNTESTED_ENV, raising=False)
    with pytest.raises(ray_compat.RayIncompatible, match=re.escape(version) + ".*"
                       + re.escape(ray_compat.SUPPORTED_RAY) + ".*" + ray_compat.ALLOW_UNTESTED_ENV):
        ray_compat.check_ray_version(version)
    monkeypatch.setenv(ray_compat.ALLOW_UNTESTED_ENV, "1")
    assert version in ray_compat.check_ray_version(version)


def test_tune_copies_no_credential_into_trial_runtime_envs(monkeypatch):
    """Tune's own list of variables it copies into each trial's runtime_env (which Ray's
    runtime-env agent logs) loses the AWS credentials, and keeps everything else."""
    import subprocess
    import sys

    from ray.tune.execution import class_cache

    # Unpatched, as a fresh process imports it: Tune copies them (the hook is still needed).
    fresh = subprocess.run([sys.executable, "-c", "from ray.tune.execution import class_cache as c; "
                            "print(sorted(c.ENV_VARS_TO_PROPAGATE))"], capture_output=True, text=True, check=True)
    assert ray_compat.CREDENTIAL_ENV <= set(eval(fresh.stdout))
    present = set(class_cache.ENV_VARS_TO_PROPAGATE)
    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", present | ray_compat.CREDENTIAL_ENV)
    ray_compat.keep_credentials_out_of_trial_envs()
    assert class_cache.ENV_VARS_TO_PROPAGATE == present - ray_compat.CREDENTIAL_ENV
    monkeypatch.setattr(class_cache, "ENV_VARS_TO_PROPAGATE", tuple(present))
    with pytest.raises(ray_compat.RayIncompatible, match="ENV_VARS_TO_PROPAGATE"):
        ray_compat.keep_credentials_out_of_trial_envs()
