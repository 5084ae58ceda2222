"""Run a function on two gloo processes on this machine and collect what each one reports."""

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


def _run(rank: int, port: int, queue, target: Callable[[int], object]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        queue.put((rank, target(rank)))
    finally:
        dist.destroy_process_group()


def run_on_two_workers(target: Callable[[int], object], timeout: float = 100) -> list[object]:
    """`target(rank)` inside an initialised 2-process gloo group (spawned, so `target` must be
    a module-level function); returns the results in rank order."""
    context = mp.get_context("spawn")
    queue = context.Queue()
    port = _free_port()
    processes = [context.Process(target=_run, args=(rank, port, queue, target)) for rank in range(WORLD)]
    for process in processes:
        process.start()
    results = sorted((queue.get(timeout=timeout) for _ in range(WORLD)), key=lambda item: item[0])
    for process in processes:
        process.join(timeout=30)
    return [result for _, result in results]
