"""`embedlab bench train`: phase-1 training throughput and peak memory, embedlab vs BERT and ModernBERT.

embedlab: `MLMModel` trained by the real phase-1 step (`mask_tokens`, then
`accumulate_gradients` and `optimizer_step` from `embedlab.train.mlm_step`, AdamW from
`build_optimizer`) on packed rows: segment ids keep documents apart, no padding is
computed, and MLM logits are computed only at the selected positions.

Reference: Hugging Face `BertForMaskedLM` of the same depth, width, heads, feed-forward
width and vocabulary (its default attention implementation, SDPA), fed the same documents
in batches of `batch_documents` through `DataCollatorForLanguageModeling` (dynamic padding
to the longest document of each batch, 15% masking, 80/10/10), with the same AdamW and
gradient clipping. Dropout is set to embedlab's (0 in the presets) on both sides.

Both sides see exactly the same token sequences: the first `documents` training-split
documents of the prepared corpus in hash order (its real length distribution), each
tokenised with the prepared tokenizer and truncated to `sequence_length - 1` tokens plus
SEP. Masking (and, for the reference, collation) is timed as part of each step; packing
is not, because the data pipeline packs ahead of training (`bench data` measures it).
Throughput counts non-padding tokens; each side runs a warm-up, then `repeats`
alternating passes over all sequences, and the median is reported.

BertForMaskedLM has parameters embedlab's encoder does not (see `reference_extra_parameters`):
absolute position and token-type embeddings and biases on every linear; embedlab instead
has RoPE (no parameters) and a final LayerNorm where BERT has an embedding LayerNorm.

Second reference: `ModernBertForMaskedLM` (`modernbert_config`), timed in the same
interleaved passes on the same collated batches, with its sparse prediction on (head and
decoder at the masked positions only, as embedlab's selected-position logits) and SDPA
attention. Matched beyond the shape: RoPE base, LayerNorm and head biases, dropout, and
global attention in every layer, as embedlab attends: ModernBERT's default alternates a
128-token sliding window with a global layer every third; at L <= 128 the window covers
nearly every document, and on the CPU a window is an SDPA mask, not less work. Not
matchable: its GeGLU feed-forward (the first matrix is d x 2f at the same `intermediate_size`,
so it computes more per token), a LayerNorm on the embeddings and none before layer 0's
attention (`modernbert_extra_parameters`). transformers 5.x's ModernBERT does not unpad:
its linears run over the padded batch on every device, and only with flash-attn on CUDA
does its attention skip padding (the kernel unpads per call); this bench runs on the CPU.

Ablations (`--ablations`): each optimisation measured on and off on the same data with
everything else held: packing, selected-position logits, SDPA vs eager attention, fused
vs for-loop AdamW, and `torch.compile` of the blocks as training compiles them
(`embedlab.train.compiling`; its compile seconds reported apart).
The eager attention and the all-position logits are bench-local variants, defined here,
of the same modules with the same weights; the encoder itself has no switch for them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from embedlab.bench.measure import Comparison, interleaved_rates, median, peak_since, start_peak_window
from embedlab.core.config import MaskingConfig, ModelConfig, TrainConfig, model_preset
from embedlab.core.errors import UsageError
from embedlab.model.encoder import MLMModel, SelfAttention, count_parameters, selected_states
from embedlab.objectives.masking import mask_tokens
from embedlab.sources.document import document_texts
from embedlab.streams.packing import chunk_document, pack_pieces
from embedlab.train.compiling import compile_blocks
from embedlab.train.mlm_step import accumulate_gradients, optimizer_step, prepare_microbatch
from embedlab.train.optim import build_optimizer

TRAIN = TrainConfig()  # learning rate, weight decay, AdamW settings and clipping: the defaults


def train_config(fused: str = "auto") -> TrainConfig:
    return dataclasses.replace(TRAIN, optimizer=dataclasses.replace(TRAIN.optimizer, fused=fused))


@dataclass(frozen=True, kw_only=True)
class TrainBench:
    """Sizes of one `bench train` run; the defaults take about a minute on 2 CPU cores."""

    preset: str = "small"
    sequence_length: int = 128
    documents: int = 400
    batch_documents: int = 32  # the reference's batch; embedlab steps hold about as many tokens
    repeats: int = 3
    threads: int = 1  # torch threads on both sides (TrainConfig.torch_threads' default)
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("sequence_length", "documents", "batch_documents", "repeats", "threads"):
            if getattr(self, name) < 1:
                raise UsageError(f"bench.{name}: must be >= 1, got {getattr(self, name)}")
        model_preset(self.preset)  # unknown presets fail here, naming the valid ones

    def model(self) -> ModelConfig:
        preset = model_preset(self.preset)
        return dataclasses.replace(preset, max_length=max(preset.max_length, self.sequence_length))


@dataclass(frozen=True)
class TokenIds:
    """What both sides need of the tokenizer (plain ids, so it crosses process boundaries)."""

    path: str
    pad: int
    sep: int
    mask: int
    special: tuple[int, ...]
    vocab_size: int

    @classmethod
    def of(cls, tokenizer) -> TokenIds:
        return cls(str(tokenizer.path), tokenizer.pad_id, tokenizer.sep_id, tokenizer.mask_id,
                   tokenizer.special_ids, tokenizer.vocab_size)


def bench_sequences(prepared, documents: int, sequence_length: int) -> list[list[int]]:
    """The first `documents` training documents in hash order, as `tokens[:L-1] + [SEP]`."""
    sources = list(prepared.record["mixture"]["shares"])
    table = prepared.corpus.read(split="train", sources=sources).sort_by("hash").slice(0, documents)
    tokenizer = prepared.tokenizer
    return [ids[: sequence_length - 1] + [tokenizer.sep_id] for ids in tokenizer.encode_batch(document_texts(table))]


# --- embedlab's side ------------------------------------------------------------------

Rows = tuple[torch.Tensor, torch.Tensor]  # (B, T) input ids, (B, T) segment ids


def packed_steps(sequences: list[list[int]], bench: TrainBench, pad_id: int) -> list[Rows]:
    """Packed rows of `sequence_length`, grouped into steps of about the reference's tokens."""
    packed = pack_pieces(sequences, sequence_length=bench.sequence_length, pad_id=pad_id)
    mean_length = sum(map(len, sequences)) / len(sequences)
    rows_per_step = max(1, round(bench.batch_documents * mean_length / bench.sequence_length))
    ids, segments = torch.from_numpy(packed.input_ids).long(), torch.from_numpy(packed.segment_ids).long()
    return list(zip(ids.split(rows_per_step), segments.split(rows_per_step)))


def padded_steps(sequences: list[list[int]], bench: TrainBench, pad_id: int) -> list[Rows]:
    """One document per row, padded to the longest of its batch: the reference's batches."""
    steps = []
    for start in range(0, len(sequences), bench.batch_documents):
        batch = sequences[start : start + bench.batch_documents]
        length = max(map(len, batch))
        ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
        segments = torch.zeros((len(batch), length), dtype=torch.long)
        for row, sequence in enumerate(batch):
            ids[row, : len(sequence)] = torch.tensor(sequence)
            segments[row, : len(sequence)] = 1
        steps.append((ids, segments))
    return steps


class EmbedlabTrainer:
    """The phase-1 step as `Phase1Loop.step` runs it, without the Ray session around it."""

    def __init__(self, model: MLMModel, optimizer: torch.optim.Optimizer, ids: TokenIds, seed: int) -> None:
        self.model, self.optimizer = model.train(), optimizer
        self.masking = MaskingConfig()
        self.ban = torch.tensor(ids.special)
        self.mask_id, self.random_range = ids.mask, (len(ids.special), ids.vocab_size)
        self.generator = torch.Generator().manual_seed(seed)

    def step(self, input_ids: torch.Tensor, segment_ids: torch.Tensor) -> int:
        """One optimizer step; returns its non-padding tokens."""
        eligible = (segment_ids > 0) & ~torch.isin(input_ids, self.ban)
        masked = mask_tokens(input_ids, eligible, self.masking, mask_id=self.mask_id,
                             random_token_range=self.random_range, generator=self.generator,
                             segment_ids=segment_ids)
        result = accumulate_gradients(self.model, [prepare_microbatch(masked, segment_ids, device=torch.device("cpu"))])
        return optimizer_step(self.model, self.optimizer, result, TRAIN.max_grad_norm).tokens

    def epoch(self, steps: list[Rows]) -> int:
        return sum(self.step(ids, segments) for ids, segments in steps)


class EagerSelfAttention(SelfAttention):
    """Bench-local: the same attention written as softmax(QK^T / sqrt(Dh) + mask) V with
    explicit matmuls, the "before" of the SDPA row. Same parameters, same outputs."""

    def attend(self, q, k, v, mask, layout=None):
        batch, _, length, _ = q.shape
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_width)  # (B, H, T, T)
        scores = scores.masked_fill(~mask, float("-inf"))
        attended = (scores.softmax(dim=-1) @ v).transpose(1, 2)  # (B, T, H, Dh)
        return attended.reshape(batch, length, self.heads * self.head_width)


class AllPositionLogits(MLMModel):
    """Bench-local: vocabulary logits at every position, then the selected ones kept: the
    "before" of the selected-position row (what a standard MLM head computes)."""

    def forward(self, input_ids, segment_ids, selected, layout=None):
        hidden = self.encoder(input_ids, segment_ids, layout)
        return selected_states(self.mlm_head(hidden), selected)  # (B, T, V) computed, (N_selected, V) returned


def build_model(config: ModelConfig, seed: int, *, all_positions: bool = False, eager: bool = False) -> MLMModel:
    """The phase-1 model with the same initial weights whatever the variant."""
    torch.manual_seed(seed)
    model = (AllPositionLogits if all_positions else MLMModel)(config)
    if eager:
        for block in model.encoder.blocks:
            attention = EagerSelfAttention(config)
            attention.load_state_dict(block.attn.state_dict())
            block.attn = attention
    return model


def embedlab_trainer(config: ModelConfig, ids: TokenIds, seed: int, *, fused: str = "auto",
                     compiled: bool = False, **variant) -> EmbedlabTrainer:
    model = build_model(config, seed, **variant)
    if compiled:
        compile_blocks(model.encoder)  # what training compiles (`train.compile`)
    return EmbedlabTrainer(model, build_optimizer(model, train_config(fused)), ids, seed)


# --- the reference --------------------------------------------------------------------

def reference_config(config: ModelConfig, ids: TokenIds, sequence_length: int):
    """`BertConfig` with embedlab's depth, width, heads, feed-forward, vocabulary and dropout;
    position embeddings cover `sequence_length`."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.width, num_hidden_layers=config.layers,
        num_attention_heads=config.heads, intermediate_size=config.ffn_width, hidden_act="gelu",
        hidden_dropout_prob=config.dropout, attention_probs_dropout_prob=config.dropout,
        max_position_embeddings=sequence_length, layer_norm_eps=config.layer_norm_eps, pad_token_id=ids.pad,
    )


def reference_extra_parameters(config: ModelConfig, reference) -> int:
    """BertForMaskedLM's parameters minus `MLMModel`'s (both heads tie the decoder to the
    input embeddings): position (P x d) and token-type (types x d) embeddings; per layer, the
    biases of Q, K, V, attention output and FFN output (5d) and of the FFN's first matrix
    (f). BERT's embedding LayerNorm (2d) and embedlab's final LayerNorm (2d) cancel."""
    d, f = config.width, config.ffn_width
    return (reference.max_position_embeddings + reference.type_vocab_size) * d + config.layers * (5 * d + f)


def modernbert_config(config: ModelConfig, ids: TokenIds, sequence_length: int):
    """`ModernBertConfig` with embedlab's depth, width, heads, feed-forward width, vocabulary,
    dropout, RoPE base and biases (norms and the head's dense layer); global attention in
    every layer; sparse prediction on; SDPA attention."""
    from transformers import ModernBertConfig

    rope = {"rope_type": "default", "rope_theta": config.rope_base}
    return ModernBertConfig(
        vocab_size=config.vocab_size, hidden_size=config.width, num_hidden_layers=config.layers,
        num_attention_heads=config.heads, intermediate_size=config.ffn_width, hidden_activation="gelu",
        max_position_embeddings=sequence_length, norm_eps=config.layer_norm_eps, norm_bias=True,
        classifier_bias=True, attention_dropout=config.dropout, mlp_dropout=config.dropout,
        embedding_dropout=config.dropout, layer_types=["full_attention"] * config.layers,
        rope_parameters={"full_attention": dict(rope), "sliding_attention": dict(rope)},
        pad_token_id=ids.pad, sep_token_id=ids.sep, eos_token_id=ids.sep, bos_token_id=None, cls_token_id=None,
        sparse_prediction=True, attn_implementation="sdpa",
    )


def modernbert_extra_parameters(config: ModelConfig) -> int:
    """ModernBertForMaskedLM's parameters minus `MLMModel`'s (both tie the decoder to the input
    embeddings, both have a vocabulary bias): GeGLU's gate half of the first FFN matrix (d x f
    per layer) plus an embedding LayerNorm (2d), minus layer 0's absent attention LayerNorm (2d)."""
    return config.layers * config.width * config.ffn_width


def linear_flops_per_token(config: ModelConfig, reference: str) -> float:
    """Forward FLOPs of one position's encoder linears: embedlab's (QKV, output, up, down) or
    ModernBERT's, whose GeGLU first matrix is twice as wide."""
    d, f = config.width, config.ffn_width
    return 2.0 * config.layers * (4 * d * d + (3 if reference == "modernbert" else 2) * d * f)


def _bert_model(config: ModelConfig, ids: TokenIds, sequence_length: int):
    from transformers import BertForMaskedLM

    return BertForMaskedLM(reference_config(config, ids, sequence_length))


def _modernbert_model(config: ModelConfig, ids: TokenIds, sequence_length: int):
    from transformers import ModernBertForMaskedLM

    return ModernBertForMaskedLM(modernbert_config(config, ids, sequence_length))


REFERENCES = {"bert": _bert_model, "modernbert": _modernbert_model}


def hf_tokenizer(ids: TokenIds):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=ids.path, pad_token="[PAD]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")


class ReferenceTrainer:
    """A Hugging Face masked LM (`REFERENCES`: BertForMaskedLM, or ModernBertForMaskedLM) with
    the usual collator: pad each batch to its longest, mask 15%."""

    def __init__(self, config: ModelConfig, ids: TokenIds, bench: TrainBench, architecture: str = "bert") -> None:
        from transformers import DataCollatorForLanguageModeling

        if architecture not in REFERENCES:
            raise UsageError(f"reference architecture {architecture!r}; valid: {sorted(REFERENCES)}")
        torch.manual_seed(bench.seed)
        self.model = REFERENCES[architecture](config, ids, bench.sequence_length).train()
        self.optimizer = build_optimizer(self.model, TRAIN)
        self.collator = DataCollatorForLanguageModeling(hf_tokenizer(ids), mlm=True, mlm_probability=0.15,
                                                        return_tensors="pt")
        self.batch_documents = bench.batch_documents

    def step(self, examples: list[dict]) -> int:
        batch = self.collator(examples)
        loss = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          labels=batch["labels"]).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), TRAIN.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return int(batch["attention_mask"].sum())

    def batches(self, sequences: list[list[int]]) -> list[list[dict]]:
        examples = [{"input_ids": sequence} for sequence in sequences]
        return [examples[i : i + self.batch_documents] for i in range(0, len(examples), self.batch_documents)]

    def epoch(self, batches: list[list[dict]]) -> int:
        return sum(self.step(batch) for batch in batches)


# --- measurements ---------------------------------------------------------------------

def _warm(epoch_steps: list, step: Callable) -> float:
    """Run the first two steps and the last (a smaller shape) once; returns the seconds taken."""
    started = time.perf_counter()
    for item in [*epoch_steps[:2], epoch_steps[-1]]:
        step(*item) if isinstance(item, tuple) else step(item)
    return time.perf_counter() - started


def _comparison(name: str, rates: dict[str, list[float]], measures: dict[str, str],
                reference: str = "reference") -> Comparison:
    """Tokens/s of "embedlab" against the side `reference` of the same interleaved `rates`."""
    return Comparison(
        name=name, embedlab=median(rates["embedlab"]), reference=median(rates[reference]),
        unit="tokens/s", better="higher", embedlab_measures=measures["embedlab"],
        reference_measures=measures[reference], runs={"embedlab": rates["embedlab"], "reference": rates[reference]},
    )


def _rate_comparison(name: str, sides: dict[str, tuple[Callable[[], int], str]], repeats: int) -> Comparison:
    """`sides` is {"embedlab": (epoch, what it measures), "reference": (...)}, in that order."""
    rates = interleaved_rates({side: epoch for side, (epoch, _) in sides.items()}, repeats)
    return _comparison(name, rates, {side: text for side, (_, text) in sides.items()})


def compare_training(sequences: list[list[int]], ids: TokenIds, bench: TrainBench) -> tuple[list[Comparison], dict]:
    """Non-padding tokens/s, embedlab vs BertForMaskedLM and vs ModernBertForMaskedLM, from
    the same interleaved passes (one embedlab figure in both rows), and the facts behind them."""
    torch.set_num_threads(bench.threads)
    config = bench.model()
    ours, steps = embedlab_trainer(config, ids, bench.seed), packed_steps(sequences, bench, ids.pad)
    bert = ReferenceTrainer(config, ids, bench, "bert")
    modernbert = ReferenceTrainer(config, ids, bench, "modernbert")
    batches = bert.batches(sequences)
    for step, items in ((ours.step, steps), (bert.step, batches), (modernbert.step, batches)):
        _warm(items, step)
    rates = interleaved_rates({"embedlab": lambda: ours.epoch(steps), "reference": lambda: bert.epoch(batches),
                               "modernbert": lambda: modernbert.epoch(batches)}, bench.repeats)
    measures = {
        "embedlab": f"MLMModel '{bench.preset}', packed rows, selected-position logits",
        "reference": f"BertForMaskedLM ({bert.model.config._attn_implementation} attention), "
                     "DataCollatorForLanguageModeling",
        "modernbert": f"ModernBertForMaskedLM ({modernbert.model.config._attn_implementation} attention, "
                      "global every layer, sparse prediction), the same collated batches",
    }
    comparisons = [_comparison("train: non-padding tokens/s", rates, measures),
                   _comparison("train: non-padding tokens/s vs ModernBERT", rates, measures, "modernbert")]
    positions = {"embedlab": sum(s[1].numel() for s in steps),
                 "reference": sum(len(b) * max(len(e["input_ids"]) for e in b) for b in batches)}
    facts = {
        "tokens_per_pass": sum(map(len, sequences)),
        "documents": len(sequences),
        "steps_per_pass": {"embedlab": len(steps), "reference": len(batches)},
        "padding_share": {k: 1 - sum(map(len, sequences)) / v for k, v in positions.items()},
        "parameters": {"embedlab": count_parameters(ours.model), "reference": count_parameters(bert.model),
                       "modernbert": count_parameters(modernbert.model)},
        "linear_flops_per_token": {side: linear_flops_per_token(config, side) for side in ("embedlab", "modernbert")},
    }
    return comparisons, facts


def compare_ablations(sequences: list[list[int]], ids: TokenIds, bench: TrainBench,
                      compile_model: bool = True) -> tuple[list[Comparison], dict]:
    """Each optimisation on (embedlab column) and off (reference column), all else equal."""
    torch.set_num_threads(bench.threads)
    config = bench.model()
    packed, padded = packed_steps(sequences, bench, ids.pad), padded_steps(sequences, bench, ids.pad)
    arms: list[tuple[str, EmbedlabTrainer, list[Rows], str, EmbedlabTrainer, list[Rows], str]] = []
    base = embedlab_trainer(config, ids, bench.seed)
    arms.append(("opt: packing", base, packed, "packed rows",
                 embedlab_trainer(config, ids, bench.seed), padded, "one document per row, padded per batch"))
    arms.append(("opt: selected-position logits", base, packed, "logits at the ~15% selected positions",
                 embedlab_trainer(config, ids, bench.seed, all_positions=True), packed,
                 "logits at every position (bench-local variant)"))
    arms.append(("opt: SDPA attention", base, packed, "scaled_dot_product_attention, block-diagonal mask",
                 embedlab_trainer(config, ids, bench.seed, eager=True), packed,
                 "eager softmax(QK^T)V (bench-local variant)"))
    arms.append(("opt: fused AdamW", base, packed, "AdamW fused kernel (optimizer.fused 'auto' on CPU)",
                 embedlab_trainer(config, ids, bench.seed, fused="off"), packed, "AdamW multi-tensor (fused 'off')"))
    facts: dict = {}
    with cold_compile_cache():
        if compile_model:
            compiled = embedlab_trainer(config, ids, bench.seed, compiled=True)
            facts["compile_seconds"] = _warm(packed, compiled.step)  # the first steps compile
            arms.append(("opt: torch.compile blocks", compiled, packed,
                         f"inductor, once compiled ({facts['compile_seconds']:.1f}s cold)", base, packed, "eager"))
        warmed = set()
        comparisons = []
        for name, on, on_steps, on_text, off, off_steps, off_text in arms:
            for trainer, steps in ((on, on_steps), (off, off_steps)):
                if id(trainer) not in warmed:
                    _warm(steps, trainer.step)
                    warmed.add(id(trainer))
            comparisons.append(_rate_comparison(name, {
                "embedlab": (lambda t=on, s=on_steps: t.epoch(s), on_text),
                "reference": (lambda t=off, s=off_steps: t.epoch(s), off_text),
            }, bench.repeats))
    return comparisons, facts


@contextlib.contextmanager
def cold_compile_cache() -> Iterator[None]:
    """An empty inductor cache for the block, so the compile time reported is a first
    compile's, not a cache hit left by an earlier run (inductor reads the variable per use)."""
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="embedlab-inductor-") as directory:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
        try:
            yield
        finally:
            if previous is None:
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def _peak_memory_child(side: str, sequences: list[list[int]], ids: TokenIds, bench: TrainBench) -> float:
    """In a fresh process: MiB of resident memory one pass of `side` adds (model, optimizer
    state, activations). Both sides resolve the same lazy imports (transformers' model,
    collator and tokenizer modules) and load the tokenizer before the window opens, so
    module code is counted on neither side."""
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling  # noqa: F401

    torch.set_num_threads(bench.threads)
    config = bench.model()
    hf_tokenizer(ids)
    if side == "embedlab":
        steps = packed_steps(sequences, bench, ids.pad)
        start = start_peak_window()
        embedlab_trainer(config, ids, bench.seed).epoch(steps)
    else:
        start = start_peak_window()
        reference = ReferenceTrainer(config, ids, bench)
        reference.epoch(reference.batches(sequences))
    return peak_since(start)


def peak_memory_child() -> None:
    """Entry point of the fresh process: a JSON request on stdin, the MiB on stdout."""
    request = json.loads(sys.stdin.read())
    bench = TrainBench(**request["bench"])
    peak = _peak_memory_child(request["side"], request["sequences"], TokenIds(**request["ids"]), bench)
    print(json.dumps({"peak_mib": peak}))


def compare_peak_memory(sequences: list[list[int]], ids: TokenIds, bench: TrainBench) -> Comparison:
    """Peak resident memory added by one training pass, each side in a fresh Python process."""
    peaks = {}
    for side in ("embedlab", "reference"):
        request = {"side": side, "sequences": sequences, "ids": dataclasses.asdict(ids),
                   "bench": dataclasses.asdict(bench)}
        done = subprocess.run([sys.executable, "-c", "from embedlab.bench.train import peak_memory_child; "
                               "peak_memory_child()"], input=json.dumps(request), capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"peak-memory process for {side} failed:\n{done.stderr[-2000:]}")
        peaks[side] = json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]
    return Comparison(
        name="train: peak memory", embedlab=peaks["embedlab"], reference=peaks["reference"], unit="MiB",
        better="lower", embedlab_measures="resident-memory high-water mark above the start of one pass "
        "(fresh process; model, optimizer state and activations)",
        reference_measures="the same for BertForMaskedLM", runs={k: [v] for k, v in peaks.items()},
    )


def bench_train(prepared, bench: TrainBench = TrainBench(), *, ablations: bool = False, memory: bool = True,
                compile_model: bool = True, progress: Callable[[str], None] = print) -> dict:
    """The training comparisons: {"comparisons": [Comparison...], "facts": {...}}."""
    ids = TokenIds.of(prepared.tokenizer)
    sequences = bench_sequences(prepared, bench.documents, bench.sequence_length)
    progress(f"bench train: {len(sequences)} documents, {sum(map(len, sequences)):,} tokens per pass, "
             f"preset {bench.preset}, L={bench.sequence_length}, {bench.repeats} repeats, {bench.threads} thread(s)")
    comparisons, facts = compare_training(sequences, ids, bench)
    if memory:
        progress("bench train: peak memory, one fresh process per side")
        comparisons.append(compare_peak_memory(sequences, ids, bench))
    if ablations:
        progress("bench train: optimisations on and off" + (" (compiling first)" if compile_model else ""))
        rows, ablation_facts = compare_ablations(sequences, ids, bench, compile_model)
        comparisons += rows
        facts.update(ablation_facts)
    return {"comparisons": comparisons, "facts": facts, "bench": dataclasses.asdict(bench)}


def train_notes(result: dict) -> list[str]:
    facts, bench = result["facts"], result["bench"]
    shares = facts["padding_share"]
    lines = [
        f"train: {facts['documents']} documents, {facts['tokens_per_pass']:,} non-padding tokens per pass on both "
        f"sides; padding computed: embedlab {shares['embedlab']:.1%}, reference {shares['reference']:.1%}; "
        f"steps per pass {facts['steps_per_pass']['embedlab']} vs {facts['steps_per_pass']['reference']}; "
        f"parameters {facts['parameters']['embedlab']:,} vs {facts['parameters']['reference']:,} "
        "(BERT adds position/type embeddings and biases)",
        f"train: preset {bench['preset']}, L={bench['sequence_length']}, torch threads {bench['threads']}, "
        f"median of {bench['repeats']} alternating passes after a warm-up",
    ]
    if "modernbert" in facts["parameters"]:
        flops = facts["linear_flops_per_token"]
        lines.append(
            "train vs ModernBERT: ModernBertForMaskedLM on BERT's collated batches (padding "
            f"{shares['reference']:.1%}; transformers 5.x ModernBERT does not unpad, and flash-attn, CUDA only, would "
            "skip padding in attention alone); matched: depth, width, heads, intermediate size, vocabulary, RoPE base, "
            "norm and head biases, dropout, global attention every layer (its default: a 128-token window in 2 of 3 "
            "layers, no saving under SDPA on the CPU), masked-position-only head (sparse_prediction); unmatched: GeGLU "
            f"({flops['modernbert'] / flops['embedlab']:.2f}x embedlab's linear FLOPs per position), an embedding "
            f"LayerNorm, no norm before layer 0's attention; parameters {facts['parameters']['modernbert']:,}")
    if "compile_seconds" in facts:
        lines.append(f"train: torch.compile's first steps took {facts['compile_seconds']:.1f}s (a cold compile, "
                     "empty inductor cache), excluded from its row")
    return lines


def tokens_per_second_by_length(prepared, lengths: tuple[int, ...] = (128, 512, 1024, 2048), preset: str = "tiny",
                                tokens: int = 16384, repeats: int = 3, threads: int = 1,
                                progress: Callable[[str], None] = print) -> list[dict]:
    """Training tokens/s of packed rows at each row length, on both attention paths.

    The same documents at every length (about `tokens` of them, untruncated: cut into pieces
    of at most L tokens as the data pipeline cuts them), about 4k positions per step. "dense"
    is SDPA with the block-diagonal mask (its cost grows with L^2 per row whatever the
    documents); "varlen" computes attention per segment (on CPU sequences batched by length
    bucket, on CUDA the flash kernel)."""
    torch.set_num_threads(threads)
    ids = TokenIds.of(prepared.tokenizer)
    documents, total = [], 0
    for sequence in bench_sequences(prepared, max(1, tokens // 8), sequence_length=10**9):
        documents.append(sequence[:-1])  # without SEP: chunk_document adds it
        total += len(sequence)
        if total >= tokens:
            break
    rows = []
    for length in lengths:
        pieces = [p for doc in documents for p in chunk_document(doc, sequence_length=length, sep_id=ids.sep)]
        packed = pack_pieces(pieces, sequence_length=length, pad_id=ids.pad)
        rows_per_step = max(1, 4096 // length)
        steps = list(zip(torch.from_numpy(packed.input_ids).long().split(rows_per_step),
                         torch.from_numpy(packed.segment_ids).long().split(rows_per_step)))
        row = {"sequence_length": length, "tokens_per_pass": packed.non_padding_tokens, "preset": preset}
        for path in ("dense", "varlen"):
            config = dataclasses.replace(model_preset(preset), max_length=max(length, 512), attention=path)
            trainer = embedlab_trainer(config, ids, seed=0)
            _warm(steps, trainer.step)
            row[path] = median(interleaved_rates({path: lambda: trainer.epoch(steps)}, repeats)[path])
        progress(f"bench scaling: L={length}: dense {row['dense']:,.0f}, varlen {row['varlen']:,.0f} tokens/s")
        rows.append(row)
    return rows
