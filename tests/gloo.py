"""Run a function on two processes of one process group (gloo unless told) on this machine and
collect what each one reports."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(rank: int, port: int, queue, target: Callable[[int], object], backend: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "fake":
        # Registers the backend's creator; without a store of ours torch would give it one
        # that cannot make the gloo groups a test asks for.
        import torch.testing._internal.distributed.fake_pg  # noqa: F401

        store = dist.TCPStore("127.0.0.1", port, WORLD, is_master=rank == 0)
        dist.init_process_group(backend, store=store, rank=rank, world_size=WORLD)
    else:
        dist.init_process_group(backend, rank=rank, world_size=WORLD)
    try:
        queue.put((rank, target(rank)))
    finally:
        dist.destroy_process_group()


def run_on_two_workers(target: Callable[[int], object], timeout: float = 100, backend: str = "gloo") -> list[object]:
    """`target(rank)` inside an initialised 2-process group of `backend` (spawned, so `target`
    must be a module-level function); returns the results in rank order. torch's "fake"
    backend stands in for NCCL where a test needs a default group that is not gloo: its
    collectives do nothing, so a sum that arrives did not go through it."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    processes = [context.Process(target=_run, args=(rank, port, queue, target, backend)) for rank in range(WORLD)]
    for process in processes:
        process.start()
    results = sorted((queue.get(timeout=timeout) for _ in range(WORLD)), key=lambda item: item[0])
    for process in processes:
        process.join(timeout=30)
    return [result for _, result in results]
