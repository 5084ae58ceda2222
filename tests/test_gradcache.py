"""GradCache equals the plain contrastive loss in loss and gradients, with one chunk's activation memory."""

import pytest
import torch
from torch import nn

from embedlab.core.config import ModelConfig
from embedlab.model.encoder import Encoder
from embedlab.model.pooling import l2_normalise, mean_pool
from embedlab.objectives.contrastive import LearnableTemperature, multi_positive_infonce, pair_masks
from embedlab.objectives.gradcache import gradcache_step

CONFIG = ModelConfig(layers=2, width=32, heads=2, ffn_width=64, vocab_size=101, dropout=0.1)
Chunk = tuple[torch.Tensor, torch.Tensor]  # token ids (B, T), segment ids (B, T)


class Tower(nn.Module):
    """Encoder + mean pooling + L2 normalisation, and the loss's learnable temperature."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder(CONFIG)
        self.temperature = LearnableTemperature(initial=0.05)

    def forward(self, chunk: Chunk) -> torch.Tensor:
        ids, segments = chunk
        return l2_normalise(mean_pool(self.encoder(ids, segments), segments > 0))


def texts(rows: int, seed: int, length: int = 12) -> Chunk:
    """Random token rows with 0-5 padding positions at the end of each."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 101, (rows, length), generator=generator)
    lengths = length - torch.randint(0, 6, (rows,), generator=generator)
    segments = (torch.arange(length)[None, :] < lengths[:, None]).long()
    return ids * segments, segments


def chunked(batch: Chunk, size: int) -> list[Chunk]:
    ids, segments = batch
    return list(zip(ids.split(size), segments.split(size)))


def contrastive(model: Tower, query_groups: torch.Tensor, candidate_groups: torch.Tensor):
    masks = pair_masks(query_groups, candidate_groups)
    return lambda queries, candidates: multi_positive_infonce(
        queries, candidates, masks.positive, masks.eligible, temperature=model.temperature()
    )


def gradients(model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dtype, tolerance, compiled", [(torch.float32, 1e-5, False), (torch.float64, 1e-10, False),
                                                        pytest.param(torch.float32, 1e-5, True, marks=pytest.mark.slow)])
def test_gradcache_equals_plain_loss_with_dropout(dtype, tolerance, compiled):
    """With dropout active, GradCache's loss and every gradient equal the plain loss's, and the
    RNG ends where one pass leaves it; also with the blocks compiled as `train.compile` does,
    whose dropout must replay the same masks in GradCache's no-grad and grad passes."""
    torch.manual_seed(0)
    model = Tower().to(dtype).train()
    if compiled:
        from embedlab.train.compiling import compile_blocks

        compile_blocks(model.encoder)
    # Unequal last chunk eager; compiled, equal chunks: each new chunk shape costs a cold compile
    # per pass and method (about 20 s each on 2 cores), and the replay property needs only one.
    queries, candidates = chunked(texts(12, 1), 4), chunked(texts(16, 2), 4 if compiled else 5)
    query_groups = torch.tensor([0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 99])  # 99: no positive
    candidate_groups = torch.tensor([0, 1, 2, 3, 3, 3, 4, 5, 6, 7, 8, 9, 50, 51, 52, 1])
    loss_fn = contrastive(model, query_groups, candidate_groups)

    torch.manual_seed(7)
    assert not torch.equal(model(queries[0]), model(queries[0]))  # dropout really changes the embeddings
    torch.manual_seed(7)
    plain = loss_fn(torch.cat([model(c) for c in queries]), torch.cat([model(c) for c in candidates]))
    plain.mean.backward()
    plain_rng = torch.get_rng_state()
    want = gradients(model)
    model.zero_grad(set_to_none=True)

    torch.manual_seed(7)
    cached = gradcache_step(model, queries, candidates, loss_fn)
    assert torch.equal(torch.get_rng_state(), plain_rng)
    assert (cached.valid, cached.candidate_sum) == (plain.valid, plain.candidate_sum) == (11, 11 * 16)
    torch.testing.assert_close(cached.mean, plain.mean.detach(), atol=tolerance, rtol=0)
    for got, expected in zip(gradients(model), want):
        torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)


class SavedTensorMeter:
    """Bytes of tensors saved for backward that are alive at once, and their peak."""

    def __init__(self) -> None:
        self.live = self.peak = 0

    def pack(self, tensor: torch.Tensor) -> "_Saved":
        return _Saved(tensor, self)

    def unpack(self, saved: "_Saved") -> torch.Tensor:
        return saved.tensor


class _Saved:
    """Counts its tensor while autograd holds it; the count drops when the graph frees it."""

    def __init__(self, tensor: torch.Tensor, meter: SavedTensorMeter) -> None:
        self.tensor, self.meter = tensor, meter
        self.bytes = tensor.numel() * tensor.element_size()
        meter.live += self.bytes
        meter.peak = max(meter.peak, meter.live)

    def __del__(self) -> None:
        self.meter.live -= self.bytes


def peak_saved_bytes(batch: int, chunk: int | None) -> int:
    """Peak saved-for-backward bytes of one step on `batch` pairs: GradCache with `chunk` rows, or plain if None."""
    torch.manual_seed(0)
    model = Tower().train()
    queries, candidates = texts(batch, 1, length=16), texts(batch, 2, length=16)
    loss_fn = contrastive(model, torch.arange(batch), torch.arange(batch))
    meter = SavedTensorMeter()
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        if chunk is None:
            loss_fn(model(queries), model(candidates)).mean.backward()
        else:
            gradcache_step(model, chunked(queries, chunk), chunked(candidates, chunk), loss_fn)
    assert meter.live == 0  # every saved tensor was released: the meter saw the whole lifetime
    return meter.peak


def test_gradcache_memory_grows_with_chunk_not_batch():
    """GradCache's peak saved activations are the same for 16 and 64 pairs in chunks of 8; the plain step's grow with the batch."""
    cached_16, cached_64 = peak_saved_bytes(16, chunk=8), peak_saved_bytes(64, chunk=8)
    plain_16, plain_64 = peak_saved_bytes(16, chunk=None), peak_saved_bytes(64, chunk=None)
    assert cached_64 <= 1.05 * cached_16
    assert plain_64 >= 3.5 * plain_16
    assert cached_64 <= plain_64 / 5
    assert peak_saved_bytes(64, chunk=16) >= 1.8 * cached_64  # and it does grow with the chunk


def test_gradcache_with_a_joint_mlm_term_equals_the_plain_step(frozen, parent):
    """A joint arm (mlm_weight 0.3; symmetric, learnable temperature, two microbatches): one
    `ContrastiveLoop` step with GradCache (chunks of 3, so an unequal last chunk) has the plain
    step's contrastive and MLM losses, gradient norms and gradients, in float64."""
    import dataclasses

    import synthetic

    trial = synthetic.contrastive_trial(parent, microbatches=2, max_grad_norm=1e9)  # no clipping
    assert trial.contrastive.mlm_weight == 0.3
    cached = dataclasses.replace(trial, contrastive=dataclasses.replace(trial.contrastive, gradcache_chunk=3))
    rows = synthetic.pair_rows(frozen, 8, seed=3)
    parts = [{k: torch.as_tensor(v[i * 4:(i + 1) * 4]) for k, v in rows.items()} for i in range(2)]

    def one_step(each):
        loop = synthetic.make_loop(each, frozen)
        # The plain step encodes a microbatch at once and GradCache chunk by chunk, so their
        # dropout masks differ: the oracle compares without dropout.
        loop.model.eval()
        loop.parameters.double()
        applied = []
        loop.optimizer.step = lambda: applied.extend(  # the gradients the update would apply
            torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in loop.parameters.parameters())
        loop.step(parts)
        assert not loop.progress.skipped and applied
        return loop, applied

    (plain, plain_grads), (chunked, chunked_grads) = one_step(trial), one_step(cached)
    for name in ("train/grad_norm", "train/grad_norm_contrastive", "train/grad_norm_mlm", "train/temperature"):
        torch.testing.assert_close(chunked.last[name], plain.last[name], atol=1e-10, rtol=0)
    torch.testing.assert_close(chunked.window, plain.window, atol=1e-10, rtol=0)
    torch.testing.assert_close(chunked.window_mlm, plain.window_mlm, atol=1e-10, rtol=0)
    assert len(chunked_grads) == len(plain_grads)
    for got, expected in zip(chunked_grads, plain_grads):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
