"""Ray versions embedlab supports, and the only private Ray symbols it touches, in one place.

embedlab otherwise uses only Ray's public API. Two things `embedlab.sweep.cluster.connect` needs
have no public API in Ray 2.60: both are settings Ray reads once, when `ray` is imported,
from a documented environment variable, and by the time `connect()` runs `ray` has long been
imported (measured on 2.60.0: `RAY_AUTH_MODE=token` set after `import ray` is not seen by
Ray until its private `Config.initialize("")` runs again). Setting the variable alone still
configures the processes Ray starts, which inherit the environment; this process needs the
private hook. Each function below names its private symbol and raises `RayIncompatible`,
naming the installed Ray and `SUPPORTED_RAY`, when that symbol is missing or has changed
shape, instead of failing somewhere inside Ray. tests/test_ray_compat.py checks every hook
against the installed Ray, so an upgrade that breaks one fails there first.
"""

from __future__ import annotations

import inspect
import os

# packaging is a dependency of Ray itself.
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from embedlab.core.errors import UserError

# The Ray releases embedlab is tested on: pyproject.toml pins ray==2.60.0. Patch releases of
# the same minor are accepted; the hooks below still check their private symbols themselves.
SUPPORTED_RAY = "==2.60.*"
# Set to 1 to run on a Ray outside SUPPORTED_RAY (connect prints a warning line instead of refusing).
ALLOW_UNTESTED_ENV = "EMBEDLAB_ALLOW_UNTESTED_RAY"
AUTH_MODE_ENV = "RAY_AUTH_MODE"
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayIncompatible(UserError, RuntimeError):
    """The installed Ray is not one embedlab supports, or lacks a private symbol it relies on."""


def _installed() -> str:
    import ray

    return ray.__version__


def _incompatible(what: str) -> RayIncompatible:
    return RayIncompatible(f"{what} in the installed Ray {_installed()}; embedlab supports ray{SUPPORTED_RAY} "
                           f"(pip install 'ray[default,train,tune,data]{SUPPORTED_RAY}')")


def check_ray_version(version: str | None = None) -> str | None:
    """None when Ray `version` (default: the installed one) is in `SUPPORTED_RAY`.

    Outside it: raise `RayIncompatible`, unless EMBEDLAB_ALLOW_UNTESTED_RAY=1, then return a
    warning line for the console (the private hooks still refuse if their symbols changed).
    """
    version = _installed() if version is None else version
    try:
        supported = Version(version) in SpecifierSet(SUPPORTED_RAY)
    except InvalidVersion:
        supported = False
    if supported:
        return None
    message = f"Ray {version} is outside the versions embedlab is tested on (ray{SUPPORTED_RAY})"
    if os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        return f"warning: {message}; running anyway ({ALLOW_UNTESTED_ENV}=1)"
    raise RayIncompatible(f"{message}: install ray[default,train,tune,data]{SUPPORTED_RAY}, or set "
                          f"{ALLOW_UNTESTED_ENV}=1 to run on it untested")


def token_auth_hook():
    """Ray's `maybe_enable_token_auth_if_token_available(warn_if_disabled: bool)`, checked."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available as hook,
        )
    except ImportError:
        raise _incompatible("ray._private.authentication.authentication_token_setup."
                            "maybe_enable_token_auth_if_token_available is missing") from None
    parameter = inspect.signature(hook).parameters.get("warn_if_disabled")
    if parameter is None or parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
        raise _incompatible("maybe_enable_token_auth_if_token_available has no warn_if_disabled argument")
    return hook


def enable_token_auth_from_local_token() -> bool:
    """Switch this process to token authentication when a token is at hand (RAY_AUTH_TOKEN,
    RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) and RAY_AUTH_MODE is unset; whether it is on.

    Ray does this by itself only for a cluster it finds locally (`address` None or "auto"),
    never for an explicit address. The public switch, RAY_AUTH_MODE=token, works only when
    set before `import ray`; set later, only Ray's private helper makes this process read it
    again (it sets the variable and re-reads Ray's config).
    """
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is not None:  # the user's own, documented choice, read by Ray at import
        return mode.lower() == "token"
    # Private: ray._private.authentication.authentication_token_setup.maybe_enable_token_auth_if_token_available.
    return bool(token_auth_hook()(warn_if_disabled=False))


def single_machine_constants():
    """Ray's `ray._private.ray_constants` module, checked for the bool `ENABLE_RAY_CLUSTER`
    computed from RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER."""
    try:
        import ray._private.ray_constants as ray_constants
    except ImportError:
        raise _incompatible("ray._private.ray_constants is missing") from None
    if not isinstance(getattr(ray_constants, "ENABLE_RAY_CLUSTER", None), bool):
        raise _incompatible("ray._private.ray_constants.ENABLE_RAY_CLUSTER is not a bool")
    if getattr(ray_constants, "ENABLE_RAY_CLUSTERS_ENV_VAR", None) != SINGLE_MACHINE_ENV:
        raise _incompatible(f"ray._private.ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR is not {SINGLE_MACHINE_ENV!r}")
    return ray_constants


def force_single_machine_mode() -> None:
    """Run a local cluster in Ray's single-machine mode, where `ray.init` keeps 127.0.0.1 as
    the node's address instead of mapping it to the machine's routable one.

    The mode is chosen by RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which the processes Ray starts
    inherit; this process read it into a module constant at `import ray`, and no public API
    sets it afterwards (`ray.init(_node_ip_address=...)` is private too and maps loopback the
    same way).
    """
    os.environ[SINGLE_MACHINE_ENV] = "0"
    # Private: ray._private.ray_constants.ENABLE_RAY_CLUSTER, read by
    # ray._private.services.get_node_ip_address.
    single_machine_constants().ENABLE_RAY_CLUSTER = False


# Credentials Ray Tune copies from the driver's environment into every trial's runtime
# environment, which Ray's runtime-env agent then writes, whole, into its log on every node.
CREDENTIAL_ENV = frozenset({"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SECURITY_TOKEN", "AWS_SESSION_TOKEN"})


def tune_propagated_env() -> set:
    """Ray Tune's `ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE`, checked to be the set
    of variable names Tune copies into each trainable's runtime_env."""
    try:
        from ray.tune.execution import class_cache
    except ImportError:
        raise _incompatible("ray.tune.execution.class_cache is missing") from None
    names = getattr(class_cache, "ENV_VARS_TO_PROPAGATE", None)
    if not isinstance(names, set) or not all(isinstance(n, str) for n in names):
        raise _incompatible("ray.tune.execution.class_cache.ENV_VARS_TO_PROPAGATE is not a set of names")
    return names


def keep_credentials_out_of_trial_envs() -> None:
    """Stop Ray Tune from copying the driver's AWS credentials into each trial's runtime_env
    (and so into Ray's logs). Trials read credentials as every other process on their node
    does: from the node's own environment (the variables `ray start` ran with, an instance
    role, ~/.aws). No public switch exists; the set is internal to Tune (not underscored, not
    documented), so it is guarded here like the private symbols above."""
    tune_propagated_env().difference_update(CREDENTIAL_ENV)
