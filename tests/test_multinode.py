"""The worker fleet (workers/): a real two-node Ray cluster on loopback takes sweeps by
`--address` and by `ray job submit`; the launcher config, the KubeRay manifest and the
worker image are checked against what `ray up`, KubeRay and a reproducible build need."""

from __future__ import annotations

import copy
import importlib.metadata as metadata
import json
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from embedlab import load_table
from embedlab.stats.table import check_equal_compute

from conftest import run_dirs, tiny_trial

ROOT = Path(__file__).resolve().parent.parent
WORKERS = ROOT / "workers"
BIN = Path(sys.executable).parent
BUDGET_TOKENS = 2_000
WORKER_CPUS = 2  # the head advertises none: every CPU task and trainer runs on the worker node

STUDY = """
from dataclasses import replace
from embedlab import Study
from embedlab.core.config import DEFAULT_BUDGET, TrialConfig

def study():
    base = TrialConfig.from_dict({config!r})
    return Study(
        name="fleet", factor="masking.ratio",
        arms={{"mask-15": base, "mask-30": replace(base, masking=replace(base.masking, ratio=0.3))}},
        seeds=(0,), budget=replace(DEFAULT_BUDGET, tokens={budget}),
    )
"""


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))  # Ray's GCS and raylets listen on every interface
        except OSError:
            return False
    return True


def _free_ports() -> tuple[int, int]:
    """A GCS port with the next 3 free (client server, two dashboard agents) and a dashboard
    port, below the kernel's ephemeral range so Ray's own random ports cannot take them."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 30_000)
        dashboard = base + 10
        if all(_bindable(p) for p in (*range(base, base + 4), dashboard)):
            return base, dashboard
    raise RuntimeError("no free port block for the rehearsal cluster")


def _processes(sessions: set[int], text: str) -> list[str]:
    """Live processes in one of `sessions`, or whose command line mentions `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        name, rest = stat.split("(", 1)[1].rsplit(")", 1)
        state, session = rest.split()[0], int(rest.split()[3])
        if state != "Z" and (session in sessions or text in cmdline):
            found.append(f"{entry.name} {name}: {cmdline[:120]}")
    return found


@dataclass
class Rehearsal:
    directory: Path
    address: str
    dashboard: str
    env: dict[str, str]

    def script(self, command: str, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(WORKERS / "rehearse.sh"), command], env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def start(self) -> None:
        started = self.script("start", timeout=240)
        assert started.returncode == 0, started.stdout + started.stderr
        assert (self.directory / "address").read_text().strip() == self.address

    def sessions(self) -> set[int]:
        return {int(p.read_text()) for p in self.directory.glob("*.pid")}

    def stop(self, sweep: subprocess.Popen | None = None) -> tuple[subprocess.CompletedProcess, set[int], list[str]]:
        """Kill `sweep` if it still runs, stop every node; (the stop, the nodes' sessions, survivors)."""
        if sweep is not None and sweep.poll() is None:
            sweep.kill()
            sweep.communicate()
        sessions = self.sessions()
        stopped = self.script("stop", timeout=180)
        return stopped, sessions, _processes(sessions, str(self.directory))


def _read_until(sweep: subprocess.Popen, prefix: str) -> list[str]:
    """The sweep's output lines up to the first that starts with `prefix` (or its end)."""
    seen = []
    for line in sweep.stdout:
        seen.append(line)
        if line.startswith(prefix):
            break
    return seen


def _join_and_finish(cluster: Rehearsal, sweep: subprocess.Popen, seen: list[str]) -> str:
    """Add a worker node (the autoscaler's part, by hand), wait for the sweep; its whole output."""
    joined = cluster.script("join", timeout=180)
    assert joined.returncode == 0, joined.stdout + joined.stderr
    rest, _ = sweep.communicate(timeout=400)
    output = "".join(seen) + rest
    assert sweep.returncode == 0, output[-6000:]
    return output


def rehearsal(cache_dir: Path) -> Rehearsal:
    """The settings of a one-head, one-worker rehearsal cluster (not started yet)."""
    port, dashboard = _free_ports()
    # Short: Ray's socket paths under each node's --temp-dir must fit in 107 characters.
    directory = Path(tempfile.mkdtemp(prefix="elr-", dir="/tmp"))
    # The test process may hold its own local Ray, whose connect() set variables that would
    # stop a worker node from joining (single-machine mode), point at the wrong cluster, or
    # give the fleet a local cluster's settings.
    from embedlab.sweep.cluster import LOCAL_RAY_ENV

    dropped = {"RAY_ADDRESS", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", *LOCAL_RAY_ENV}
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", RAY=str(BIN / "ray"), RAY_AUTH_MODE="token",
        EMBEDLAB_CACHE=str(cache_dir), REHEARSAL_DIR=str(directory), REHEARSAL_PORT=str(port),
        REHEARSAL_DASHBOARD_PORT=str(dashboard), REHEARSAL_WORKERS="1", REHEARSAL_HEAD_CPUS="0",
        REHEARSAL_WORKER_CPUS=str(WORKER_CPUS),
    )
    return Rehearsal(directory, f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}", env)


def _check_table(run_dir: str, cache_dir: Path):
    """Both arms finished at equal tokens, checkpoints on S3, data prepared in `cache_dir` by the
    sweep's driver, and every row's scores what this process computes from its checkpoint."""
    from embedlab.core import store

    table = load_table(run_dir)
    assert sorted(zip(table["arm"], table["seed"])) == [("mask-15", 0), ("mask-30", 0)]
    assert set(table["status"]) == {"finished"}
    assert sorted(table["factor_value"]) == [0.15, 0.3]
    assert all(c.startswith("s3://") for c in table["checkpoint"])
    rows_per_step = tiny_trial().train.batch_rows * tiny_trial().data.sequence_length
    assert table["budget/tokens"].between(BUDGET_TOKENS, BUDGET_TOKENS + rows_per_step - 1).all()
    assert check_equal_compute(table, "tokens") <= 0.01
    prepared = json.loads(store.read_text(store.join(run_dir, "prepared.json")))
    assert {Path(p["directory"]).parent for p in prepared.values()} == {cache_dir}  # EMBEDLAB_CACHE reached the driver
    for row in table.to_dict("records"):
        _check_scores(row, Path(prepared[row["arm"]]["directory"]), run_dir)
    return table


def _check_scores(row: dict, prepared_dir: Path, run_dir: str) -> None:
    """The row's scores (from the evaluation actor on the cluster) are what `evaluate_checkpoint`
    computes here from the row's checkpoint (this process's verified copy of it), called as the
    trial driver calls the actor (the trial's task, split, index and max_length, the prepared
    data's retention panel) on one torch thread as the actor runs: every metric, count and hash
    equal, and the per-query values too."""
    import pandas as pd
    import torch

    from embedlab.checkpoints.io import local_checkpoint
    from embedlab.core import store
    from embedlab.core.beir import load_task
    from embedlab.evaluate.checkpoint_eval import evaluate_checkpoint
    from embedlab.tasks.resolve import resolve_task
    from embedlab.tasks.metrics import METRIC_NAMES

    settings = tiny_trial(num_workers=1).eval  # the study's trials (STUDY) evaluate with these
    split = settings.split
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ours = evaluate_checkpoint(local_checkpoint(row["checkpoint"]),
                                   load_task(resolve_task(settings.task, prepared_dir)), split,
                                   index=settings.index, max_length=settings.max_length,
                                   retention_dir=prepared_dir / "retention")
    finally:
        torch.set_num_threads(threads)
    assert row[f"{split}/ndcg@10"] == ours["ndcg@10"]
    for key in (*METRIC_NAMES, "queries", "docs"):
        assert row[f"{split}/{key}"] == ours[key], key
    assert (row["checkpoint_hash"], row["eval/task_hash"], row["eval/index"]) == (
        ours["checkpoint_hash"], ours["task_hash"], ours["index"])
    retention = {k: v for k, v in ours.items() if k.startswith("retention/")}
    assert retention and {k: None if pd.isna(row[k]) else row[k] for k in retention} == retention  # None: NaN in a table
    stored = json.loads(store.read_text(store.join(run_dir, "per_query", f"{row['trial_id']}.json")))
    assert stored["values"] == {f"{split}/{metric}": values for metric, values in ours["per_query"].items()}


def _trained_on(cluster: Rehearsal) -> list[str]:
    """The worker nodes whose logs show a Ray Train worker."""
    return [node for node in ("worker-1", "worker-2") if any(
        ":actor_name:RayTrainWorker" in log.read_text(errors="replace")
        for log in (cluster.directory / node / "session_latest" / "logs").glob("worker-*.out"))]


# One rehearsal cluster proves what three did (each start and stop costs most of a minute).
# About 3 minutes on an idle 2-core machine; the limit leaves room for a busy one.
@pytest.mark.ray
@pytest.mark.timeout(900)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="rehearse.sh needs setsid, pgrep and /proc")
def test_a_fleet_without_a_shared_disk_grows_and_takes_sweeps_by_address_and_by_job(s3_server, tmp_path):
    """No shared disk: the driver, the head and each worker node have their own EMBEDLAB_CACHE,
    and only the S3 endpoint is shared (`--storage s3://...`). The head and the rehearsal's
    worker node hold trial drivers and the evaluator but no CPU:

    - `embedlab sweep --address` is refused at once, naming --wait-for-resources, writing nothing;
    - with `--wait-for-resources 300` it says what it waits for and goes on once
      `rehearse.sh join` adds a node with CPUs mid-sweep (the autoscaler's part, by hand),
      sizing its concurrency from the node that arrived; that node trains every trial on its
      own copy of the driver's prepared data, fetched and checked file by file against the
      hash the run recorded;
    - the same study by `ray job submit` runs its driver on the head (the working directory
      uploaded, the cluster found through RAY_ADDRESS by --address auto, the cache by env)
      and gets the same numbers;
    - both tables hold every arm at equal tokens, scored as this process scores their S3
      checkpoints, no run directory is local, and `rehearse.sh stop` leaves no process of
      that cluster (the joined node's included) and spares this process's own Ray."""
    import ray

    from embedlab.artifacts.sync import tree_manifest
    from embedlab.core import store

    study = tmp_path / "job" / "fleet.py"
    study.parent.mkdir()
    study.write_text(STUDY.format(config=tiny_trial(num_workers=1).to_dict(), budget=BUDGET_TOKENS))
    driver_cache = tmp_path / "driver-cache"
    cluster = rehearsal(driver_cache)
    cluster.env.update(REHEARSAL_NODE_CACHES="1", REHEARSAL_WORKER_CPUS="0")
    storage = store.join(s3_server.bucket("fleet"), "runs")
    command = [str(BIN / "embedlab"), "sweep", str(study), "--address", cluster.address, "--storage", storage]
    sweep = None
    try:
        cluster.start()
        refused = subprocess.run(command, env=cluster.env, capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2, refused.stdout[-4000:] + refused.stderr[-4000:]
        assert f"does not fit the cluster at {cluster.address} (0 CPUs, 0 GPUs)" in refused.stderr
        assert "--wait-for-resources" in refused.stderr and not store.list_tree(storage)

        sweep = subprocess.Popen([*command, "--wait-for-resources", "300"], env=cluster.env, text=True,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        seen = _read_until(sweep, "waiting for the autoscaler:")  # (or its end: the assertion shows why)
        assert seen[-1].startswith("waiting for the autoscaler: need 1.5 CPUs/0 GPUs for one trial of arm "
                                   "mask-15, cluster has 0 CPUs/0 GPUs; "), "".join(seen)[-4000:]
        cluster.env["REHEARSAL_WORKER_CPUS"] = str(WORKER_CPUS)  # the node that joins has CPUs
        output = _join_and_finish(cluster, sweep, seen)
        assert re.search(rf"ray: the autoscaler's nodes arrived after \d+ s: {WORKER_CPUS} CPUs/0 GPUs", output)
        assert f"at most {WORKER_CPUS} at a time" in output  # sized from the worker node that arrived
        assert "publishing" in output and "results in s3://" in output

        # A job runs its driver on the head: the working directory is uploaded, the sweep
        # finds its cluster through RAY_ADDRESS (--address auto), and the cache comes by env.
        job = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", cluster.dashboard, "--working-dir", str(study.parent),
             "--runtime-env-json", json.dumps({"env_vars": {"EMBEDLAB_CACHE": str(driver_cache)}}), "--",
             "embedlab", "sweep", study.name, "--address", "auto", "--storage", storage],
            env=cluster.env, capture_output=True, text=True, timeout=400)
        assert job.returncode == 0 and "succeeded" in job.stdout, job.stdout[-4000:] + job.stderr[-4000:]
        assert f"ray: {WORKER_CPUS} CPUs" in job.stdout  # the job's driver sees the worker nodes' CPUs
    finally:
        stopped, sessions, survivors = cluster.stop(sweep)
    try:
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert len(sessions) == 3 and not survivors, survivors
        found = run_dirs(storage, "fleet")
        assert len(found) == 2, found
        by_address, by_job = (_check_table(run_dir, driver_cache) for run_dir in found)
        assert set(by_address["data_revision"]) == set(by_job["data_revision"])
        for column in ("train/loss", "dev/ndcg@10"):  # one study, one seed: the same numbers either way
            assert list(by_address.sort_values("arm")[column]) == pytest.approx(list(by_job.sort_values("arm")[column]))
        assert _trained_on(cluster) == ["worker-2"]  # the node that joined mid-sweep, for both sweeps
        record = json.loads(store.read_text(store.join(found[0], "prepared.json")))["mask-15"]
        published = json.loads(store.read_text(store.join(record["published"], f"files-{record['tree_hash']}.json")))
        name = Path(record["directory"]).name
        copies = [cluster.directory / f"{node}-cache" / name for node in ("head", "worker-1", "worker-2")]
        assert copies[2].is_dir()
        for copy in filter(Path.is_dir, copies):  # every node's copy: the published bytes
            assert {r: sha for r, sha in tree_manifest(copy)["files"].items() if r in published["files"]} == (
                published["files"]), copy
        assert not (tmp_path / "runs").exists() and not (study.parent / "runs").exists()
    finally:
        shutil.rmtree(cluster.directory, ignore_errors=True)
    if ray.is_initialized():  # the session's local cluster (other tests) still answers
        assert ray.get(ray.put("alive")) == "alive"


def test_rehearse_script_parses_and_never_runs_ray_stop():
    """rehearse.sh is valid bash and stops only its own nodes: `ray stop` would stop every Ray
    process on the machine, other people's clusters and test sessions included."""
    script = WORKERS / "rehearse.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    code = [line.split("#", 1)[0] for line in script.read_text().splitlines()]
    assert not [line for line in code if re.search(r'(\$RAY"?|\bray)\s+stop\b', line)]
    usage = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert usage.returncode == 2 and "start|status|stop" in usage.stderr


def _fits_a_full_trial(cpus: float, gpus: float) -> None:
    """A sweep of the default (GPU) profile started on the fleet at its minimum size is not
    refused: the sweep sizes its concurrency from the resources present when it starts."""
    from embedlab import recipes
    from embedlab.sweep.cluster import max_concurrent_trials

    assert max_concurrent_trials(recipes.phase1_baseline(recipes.DEFAULT_PROFILE), {"CPU": cpus, "GPU": gpus}) >= 1


def _image(reference: str) -> None:
    """An image pinned by a tag (not `latest`)."""
    name, _, tag = reference.rpartition(":")
    assert name and "/" not in tag and tag and tag != "latest", reference


def test_cluster_launcher_config_is_accepted_by_ray_up_validation():
    """workers/cluster.yaml passes Ray's launcher schema and the checks `ray up` runs after
    filling in the provider's defaults, with a CPU-free head, a GPU worker type that holds a
    full trial at its minimum, the dashboard on the head's loopback and token authentication
    on every node."""
    import jsonschema
    import ray.autoscaler
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((WORKERS / "cluster.yaml").read_text())
    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    jsonschema.validate(config, schema)
    validate_config(prepare_config(copy.deepcopy(config)))
    types = config["available_node_types"]
    assert types[config["head_node_type"]]["resources"]["CPU"] == 0
    gpu_types = [t for t in types.values() if t["resources"].get("GPU", 0) > 0]
    assert gpu_types and all(t["min_workers"] >= 1 for t in gpu_types)
    assert sum(t["max_workers"] for t in gpu_types) <= config["max_workers"]
    _fits_a_full_trial(*(sum(t.get("min_workers", 0) * t["resources"].get(r, 0) for t in types.values())
                         for r in ("CPU", "GPU")))
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--head" in head_start and "--dashboard-host=127.0.0.1" in head_start
    assert "--address=$RAY_HEAD_IP:6379" in " ".join(config["worker_start_ray_commands"])
    _image(config["docker"]["image"])
    run_options = " ".join(config["docker"]["run_options"])
    assert "RAY_AUTH_MODE=token" in run_options and "~/.ray/auth_token" in config["file_mounts"]
    shared = re.search(r"--volume (\S+):(\S+)", run_options).group(2)
    assert re.search(rf"EMBEDLAB_CACHE={re.escape(shared)}/", run_options)


def test_kuberay_manifest_has_gpu_workers_and_a_shared_volume():
    """workers/raycluster.yaml: a ray.io/v1 RayCluster at the installed Ray version with a head
    group and a GPU worker group (nvidia.com/gpu limits) that holds a full trial at its
    minimum, every container on the tag-pinned worker image, and the shared ReadWriteMany
    volume mounted where EMBEDLAB_CACHE points."""
    import ray

    documents = list(yaml.safe_load_all((WORKERS / "raycluster.yaml").read_text()))
    by_kind = {d["kind"]: d for d in documents}
    assert sorted(by_kind) == ["PersistentVolumeClaim", "RayCluster"]
    claim = by_kind["PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    cluster = by_kind["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1"
    spec = cluster["spec"]
    assert spec["rayVersion"] == ray.__version__
    assert spec["authOptions"]["mode"] == "token"
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0" and head["rayStartParams"]["dashboard-host"] == "127.0.0.1"
    groups = spec["workerGroupSpecs"]
    assert groups and all(isinstance(v, str) for g in [head, *groups] for v in g["rayStartParams"].values())
    images = set()
    for group in [head, *groups]:
        pod = group["template"]["spec"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        for container in pod["containers"]:
            images.add(container["image"])
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            shared = next(n for n, v in volumes.items()
                          if v.get("persistentVolumeClaim", {}).get("claimName") == claim["metadata"]["name"])
            cache = {e["name"]: e.get("value") for e in container["env"]}["EMBEDLAB_CACHE"]
            assert cache.startswith(mounts[shared] + "/"), (cache, mounts)
    cpus = gpus = 0
    for group in groups:
        container = group["template"]["spec"]["containers"][0]
        limits = container["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1
        assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]
        cpus += group["minReplicas"] * float(limits["cpu"])
        gpus += group["minReplicas"] * int(limits["nvidia.com/gpu"])
    _fits_a_full_trial(cpus, gpus)
    assert len(images) == 1
    _image(images.pop())


def _instructions(dockerfile: str) -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    lines = [line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")]
    return [i.strip() for i in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if i.strip()]


def _pinned(requirement: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9._-]+(\[[A-Za-z0-9,._-]+\])?==[A-Za-z0-9.+!_-]+", requirement) is not None


def test_worker_image_pins_every_install():
    """workers/Dockerfile: a tag-pinned base, and every `pip install` names exact versions,
    the lock (itself all exact pins) or the project constrained by the lock; the lock pins
    every runtime dependency and the gpu extra of pyproject.toml within their ranges."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    instructions = _instructions((WORKERS / "Dockerfile").read_text())
    bases = [i.split()[1] for i in instructions if i.upper().startswith("FROM ")]
    assert bases
    for base in bases:
        _image(base)
    lock_lines = [line for line in (WORKERS / "requirements.lock").read_text().splitlines()
                  if line and not line.startswith("#")]
    assert lock_lines and all(_pinned(line) for line in lock_lines), [l for l in lock_lines if not _pinned(l)]
    lock = {canonicalize_name(Requirement(line).name): Requirement(line) for line in lock_lines}

    installs = []
    for instruction in instructions:
        if instruction.upper().startswith("RUN "):
            lexer = shlex.shlex(instruction[4:], posix=True, punctuation_chars=True)
            lexer.wordchars += "+:[],@"  # keep `torch==2.13.0+cu128` and `src[gpu]` whole
            command: list[str] = []
            for token in [*lexer, ";"]:
                if token in ("&&", "||", ";", "|"):
                    if command[:2] == ["pip", "install"]:
                        installs.append(command[2:])
                    command = []
                else:
                    command.append(token)
    assert len(installs) >= 3
    for words in installs:
        constrained = False
        args = iter(words)
        for word in args:
            if word in ("-r", "-c"):
                assert next(args).endswith("requirements.lock")
                constrained = True
            elif word.startswith("-"):
                assert word in ("--no-cache-dir",), f"unexpected pip option {word}"
            elif word.startswith(("/", ".")) or word.startswith('"/'):
                assert constrained, f"{word}: a local project must be installed with -c requirements.lock"
            else:
                assert _pinned(word), f"pip install {word}: not an exact pin"
                name = canonicalize_name(Requirement(word).name)
                if name in lock:
                    assert Requirement(word).specifier == lock[name].specifier, word

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"] + project["optional-dependencies"]["gpu"]:
        wanted = Requirement(text)
        name = canonicalize_name(wanted.name)
        assert name in lock, f"{name} is missing from workers/requirements.lock: run .venv/bin/python workers/lock.py"
        version = next(iter(lock[name].specifier)).version
        assert wanted.specifier.contains(version, prereleases=True), (
            f"{name}=={version} in the lock is outside pyproject's {wanted.specifier}: run workers/lock.py")
        assert set(wanted.extras) <= set(lock[name].extras), f"{name}: the lock lacks extras {wanted.extras}"
    tested = metadata.version("torch").split("+")[0]
    assert str(lock["torch"].specifier) == f"=={tested}", "the image's torch is not the one the tests run with"
