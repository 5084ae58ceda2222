"""GradCache: the gradients of a large contrastive batch with the encoder memory of one chunk.

Gao, Zhang, Han and Callan 2021, "Scaling Deep Contrastive Learning Batch Size under
Memory Limited Setup" (arXiv:2101.06983). A contrastive loss couples the rows of a batch
only through their embeddings, so by the chain rule

    dL/dtheta = sum_chunks (dL/de_chunk)^T  de_chunk/dtheta

and the two factors can be computed at different times:

1. Embedding pass: encode every chunk under `no_grad` (no activations kept), recording the
   RNG state before each chunk.
2. Loss pass: the loss on the embeddings, detached and made leaves that require grad;
   backward of the objective (`ContrastiveLoss.objective`: scale * loss_sum / count) gives
   dL/de for every row (the cache), and gives parameters used only by the loss (a
   `LearnableTemperature`) their whole gradient.
3. Re-encode pass: chunk by chunk, restore that chunk's RNG state, re-encode WITH grad and
   call `backward(gradient=cached dL/de_chunk)`; only one chunk's graph is alive at a time.

Why the RNG restore: dropout. The cached dL/de belongs to the embeddings of pass 1; the
re-encode must draw the same dropout masks or the Jacobian it multiplies belongs to a
different network. Each chunk is re-encoded from the exact CPU (and, when CUDA is in use,
every device's) RNG state it started from in pass 1; the whole re-encode pass runs inside
`torch.random.fork_rng`, so after the step the RNG is where pass 1 left it, as if each chunk
had been encoded once. This reproduces every draw that depends only on the RNG state and
the chunk (dropout); nondeterministic kernels can still differ in the last bits.

Result: parameter `.grad` (accumulated, as by `backward()`) equals the gradient of the
plain objective (the same scale and count) on the whole batch encoded chunk by chunk from
the same RNG state; a scale below 1 (a contrastive term weighted beside another, such as
a joint MLM term) scales the cache and so every gradient it reaches. Cost: one
extra forward pass per chunk. Memory: the encoder's saved activations are those of one
chunk, whatever the batch; the embeddings (N + M, d) and the loss's (N, M) matrices still
grow with the batch. A module with running statistics (BatchNorm) would update them in
both encoding passes; embedlab's encoder has none.

Across workers, gather inside `loss_fn` (`embedlab.objectives.gather.gather_with_grad`):
the loss pass's backward then runs the all-gather's reduce-scatter, so the cached dL/de
already holds every rank's contribution, and the re-encode pass is local. Sum parameter
gradients over ranks afterwards, as without GradCache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch

from embedlab.objectives.contrastive import ContrastiveLoss

Chunk = TypeVar("Chunk")


@dataclasses.dataclass(frozen=True)
class _RngState:
    """The CPU generator's state and, if CUDA is initialised, every CUDA device's."""

    cpu: torch.Tensor
    cuda: tuple[torch.Tensor, ...]

    @classmethod
    def capture(cls) -> _RngState:
        cuda = tuple(torch.cuda.get_rng_state_all()) if torch.cuda.is_initialized() else ()
        return cls(cpu=torch.get_rng_state(), cuda=cuda)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        if self.cuda:
            torch.cuda.set_rng_state_all(self.cuda)


def gradcache_step(
    encode: Callable[[Chunk], torch.Tensor],
    query_chunks: Sequence[Chunk],
    candidate_chunks: Sequence[Chunk],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], ContrastiveLoss],
    *,
    global_valid: int | None = None,
    scale: float = 1.0,
    encode_candidates: Callable[[Chunk], torch.Tensor] | None = None,
) -> ContrastiveLoss:
    """Accumulate d(scale * loss_sum / global_valid)/d(theta) into `.grad` with one chunk's activations.

    encode(chunk) -> (n_chunk, d) embeddings (pooled and L2-normalised by the caller);
    `encode_candidates` encodes the candidate chunks when the two towers differ (default:
    `encode`). loss_fn(queries (N, d), candidates (M, d)) -> ContrastiveLoss, the rows in
    chunk order. The differentiated objective is scale * loss_sum / global_valid
    (`ContrastiveLoss.objective`, as a plain backward computes it): pass the valid anchor
    count of the whole step (all microbatches, all workers); None means this result's own
    count (`ContrastiveLoss.mean`), right for one process and one microbatch. `scale` is the
    term's weight in the step's objective (1 - w beside a joint MLM term of weight w).

    Returns the loss pass's ContrastiveLoss with `loss_sum` detached.
    """
    if global_valid is not None and global_valid <= 0:
        raise ValueError(f"global_valid must be > 0, got {global_valid}; a step without a valid anchor "
                         "is skipped, not run")
    encode_candidates = encode if encode_candidates is None else encode_candidates
    jobs = [(encode, chunk) for chunk in query_chunks]
    jobs += [(encode_candidates, chunk) for chunk in candidate_chunks]

    states, leaves = [], []
    with torch.no_grad():
        for encoder, chunk in jobs:
            states.append(_RngState.capture())
            leaves.append(encoder(chunk).detach().requires_grad_())  # (n_chunk, d) leaves

    split = len(query_chunks)
    result = loss_fn(torch.cat(leaves[:split]), torch.cat(leaves[split:]))
    result.objective(global_valid, scale).backward()

    cuda_devices = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else ()
    with torch.random.fork_rng(devices=cuda_devices, device_type="cuda"):
        for (encoder, chunk), state, leaf in zip(jobs, states, leaves):
            state.restore()
            encoder(chunk).backward(gradient=leaf.grad)
    return dataclasses.replace(result, loss_sum=result.loss_sum.detach())
