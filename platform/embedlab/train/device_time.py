"""Device time of the training steps: what `compute/device_seconds` reports.

On CUDA, CUDA events recorded around each step on the worker's stream, read (one host
synchronisation) when the loop reports, or after every step when device time is the budget
itself; on CPU, the CPU time of the thread that runs the
step (`time.thread_time`), which with `train.torch_threads` = 1 (the default, and what Ray
sets) is all of torch's compute. With more torch threads the process's CPU time is taken
instead, as intra-op threads run outside the calling thread; it then also holds the worker's
other threads (data prefetch), and the manifest says which clock ran. Wall time is never
multiplied by workers to stand for it: `compute/wall_seconds` is its own column.
"""

from __future__ import annotations

import time

import torch

def clock_name(device: torch.device, torch_threads: int) -> str:
    if device.type == "cuda":
        return "cuda-events"
    return "thread-cpu" if torch_threads == 1 else "process-cpu"


class DeviceClock:
    """Accumulates the device seconds of the spans between `start()` and `stop()`."""

    def __init__(self, device: torch.device, torch_threads: int = 1) -> None:
        self.name = clock_name(device, torch_threads)
        self.device = device
        self._pending: list[tuple] = []  # CUDA (start, end) events not yet read
        self._started: float | None = None
        self._seconds = 0.0

    def _cpu_now(self) -> float:
        return time.thread_time() if self.name == "thread-cpu" else time.process_time()

    def start(self) -> None:
        if self.name == "cuda-events":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._pending.append((event, None))
        else:
            self._started = self._cpu_now()

    def stop(self) -> None:
        if self.name == "cuda-events":
            begin, _ = self._pending[-1]
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending[-1] = (begin, end)
        else:
            self._seconds += self._cpu_now() - self._started
            self._started = None

    def take(self) -> float:
        """Seconds accumulated since the last `take` (reads pending CUDA events)."""
        if self._pending:
            self._pending[-1][1].synchronize()
            self._seconds += sum(begin.elapsed_time(end) for begin, end in self._pending) / 1000.0
            self._pending.clear()
        seconds, self._seconds = self._seconds, 0.0
        return seconds
