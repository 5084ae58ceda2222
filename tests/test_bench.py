"""`embedlab bench`: what each comparison measures, not how fast it is (no timed assertions)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from embedlab.bench.measure import Comparison, comparisons_json, format_comparisons
from embedlab.bench.train import (
    AllPositionLogits,
    ReferenceTrainer,
    TokenIds,
    TrainBench,
    bench_sequences,
    build_model,
    embedlab_trainer,
    packed_steps,
    padded_steps,
    reference_config,
    reference_extra_parameters,
)
from embedlab.cli import build_parser, main
from embedlab.cli.bench import cmd_bench_all, cmd_bench_mfu, cmd_bench_train
from embedlab.core.config import MODEL_PRESETS, model_preset
from embedlab.core.errors import UsageError
from embedlab.model.encoder import MLMModel, count_parameters

from conftest import TEST_DATA

pytestmark = pytest.mark.timeout(300)

TINY = TrainBench(preset="tiny", sequence_length=64, documents=24, batch_documents=8, repeats=1)


@pytest.fixture(scope="module")
def spec(tmp_path_factory, prepared) -> Path:
    path = tmp_path_factory.mktemp("spec") / "data.json"
    path.write_text(json.dumps(dataclasses.asdict(TEST_DATA)))
    return path


@pytest.fixture(scope="module")
def sequences(prepared) -> list[list[int]]:
    return bench_sequences(prepared, TINY.documents, TINY.sequence_length)


def test_both_sides_train_on_the_same_non_padding_tokens(prepared, sequences):
    """One pass of embedlab's step (packed) and of BertForMaskedLM (collated) counts the same tokens."""
    ids = TokenIds.of(prepared.tokenizer)
    assert all(len(s) <= TINY.sequence_length and s[-1] == ids.sep for s in sequences)
    ours = embedlab_trainer(TINY.model(), ids, seed=0)
    reference = ReferenceTrainer(TINY.model(), ids, TINY)
    total = sum(map(len, sequences))
    assert ours.epoch(packed_steps(sequences, TINY, ids.pad)) == total
    assert ours.epoch(padded_steps(sequences, TINY, ids.pad)) == total
    assert reference.epoch(reference.batches(sequences)) == total


def test_packed_steps_compute_less_padding_than_the_reference_batches(prepared, sequences):
    """Packed rows hold every token once with fewer positions than per-document padded rows."""
    pad = prepared.tokenizer.pad_id
    packed, padded = packed_steps(sequences, TINY, pad), padded_steps(sequences, TINY, pad)
    assert sum(int((s > 0).sum()) for _, s in packed) == sum(int((s > 0).sum()) for _, s in padded)
    assert sum(s.numel() for _, s in packed) < sum(s.numel() for _, s in padded)
    assert sum(len(s) for _, s in padded) == len(sequences)


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_reference_differs_by_the_documented_parameters(preset, prepared):
    """BertForMaskedLM of the same shape has exactly `reference_extra_parameters` more parameters."""
    from transformers import BertForMaskedLM

    config = model_preset(preset)
    reference = reference_config(config, TokenIds.of(prepared.tokenizer), 512)
    with torch.device("meta"):
        ours, theirs = count_parameters(MLMModel(config)), count_parameters(BertForMaskedLM(reference))
    assert (reference.num_hidden_layers, reference.hidden_size, reference.num_attention_heads,
            reference.intermediate_size, reference.vocab_size) == (
        config.layers, config.width, config.heads, config.ffn_width, config.vocab_size)
    assert theirs - ours == reference_extra_parameters(config, reference)


def test_bench_local_variants_compute_the_same_model():
    """The eager-attention and all-position-logit variants give MLMModel's logits on packed rows."""
    config = model_preset("tiny", vocab_size=512)
    ids = torch.randint(5, 512, (3, 32))
    segments = torch.tensor([[1] * 10 + [2] * 14 + [0] * 8, [1] * 32, [1] * 5 + [2] * 5 + [3] * 22])
    selected = torch.rand(3, 32, generator=torch.Generator().manual_seed(0)) < 0.3
    selected &= segments > 0
    expected = build_model(config, seed=1)(ids, segments, selected)
    for variant in ({"eager": True}, {"all_positions": True}):
        model = build_model(config, seed=1, **variant)
        assert isinstance(model, AllPositionLogits) == ("all_positions" in variant)
        torch.testing.assert_close(model(ids, segments, selected), expected, rtol=1e-4, atol=1e-5)


def test_comparison_ratio_and_json_shape():
    """ratio = embedlab / reference; the JSON is {name: {embedlab, reference, ratio, unit, ...}}."""
    rows = [Comparison(name="a", embedlab=3.0, reference=2.0, unit="tokens/s", better="higher",
                       embedlab_measures="x", reference_measures="y"),
            Comparison(name="b", embedlab=1.0, reference=4.0, unit="s", better="lower",
                       embedlab_measures="x", reference_measures="y")]
    shape = comparisons_json(rows)
    assert shape["a"]["ratio"] == 1.5 and shape["b"]["ratio"] == 0.25
    assert set(shape["a"]) >= {"embedlab", "reference", "ratio", "unit", "better"}
    assert "1.500" in format_comparisons(rows)
    with pytest.raises(ValueError, match="better"):
        Comparison(name="c", embedlab=1, reference=1, unit="s", better="faster", embedlab_measures="",
                   reference_measures="")


def test_bench_train_cli_reports_every_comparison(spec, capsys):
    """`bench train --ablations --json` prints both values and their ratio for training (against BERT
    and ModernBERT), memory and each optimisation (compile skipped: it takes a minute)."""
    argv = ["bench", "train", str(spec), "--preset", "tiny", "--documents", "24", "--sequence-length", "64",
            "--batch-documents", "8", "--repeats", "1", "--ablations", "--no-compile", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result) == {"train: non-padding tokens/s", "train: non-padding tokens/s vs ModernBERT",
                           "train: peak memory", "opt: packing", "opt: selected-position logits",
                           "opt: SDPA attention", "opt: fused AdamW"}
    for row in result.values():
        assert row["embedlab"] > 0 and row["reference"] > 0
        assert row["ratio"] == pytest.approx(row["embedlab"] / row["reference"])
    assert result["train: peak memory"]["unit"] == "MiB" and result["train: peak memory"]["better"] == "lower"


def test_bench_contrastive_runs_the_real_step_both_ways(prepared):
    """GradCache and plain steps both train on the same real pairs; pairs/s reported for each."""
    from embedlab.bench.contrastive import ContrastiveBench, bench_contrastive

    bench = ContrastiveBench(preset="tiny", batch_pairs=8, gradcache_chunk=4, pair_length=32, steps=1,
                             repeats=1, memory=False)
    (row,) = bench_contrastive(prepared, bench, progress=lambda message: None)["comparisons"]
    assert row.unit == "pairs/s" and row.embedlab > 0 and row.reference > 0


def test_scaling_labels_extrapolated_encoding(prepared):
    """Tokens/s is measured per length on both attention paths; encoding beyond the limit is labelled."""
    from embedlab.bench.scaling import eval_time_by_corpus_size, format_scaling
    from embedlab.bench.train import tokens_per_second_by_length

    lengths = tokens_per_second_by_length(prepared, (32, 64), tokens=512, repeats=1, progress=lambda m: None)
    corpus = eval_time_by_corpus_size(prepared, (40, 400), encode_limit=40, queries=5, preset="tiny",
                                      progress=lambda m: None)
    assert [r["sequence_length"] for r in lengths] == [32, 64] and all(r["dense"] > 0 < r["varlen"] for r in lengths)
    assert corpus[0]["encode"] == "measured" and corpus[1]["encode"].startswith("extrapolated")
    assert "| 400 |" in format_scaling({"length": lengths, "corpus": corpus})


def test_mfu_counts_model_flops_and_measures_on_any_device():
    """Model FLOPs = 6 x body x tokens + 6 x head x selected + 12 L d sum(len^2); MFU = achieved / peak."""
    from embedlab.bench.mfu import MfuBench, body_parameters, measure_mfu, model_flops, segment_lengths
    from embedlab.bench.synthetic import synthetic_rows

    config = model_preset("tiny", vocab_size=512)
    d, layers = config.width, config.layers
    expected = 6 * body_parameters(config) * 10 + 6 * (d * d + d * 512) * 2 + 12 * layers * d * (4**2 + 6**2)
    assert model_flops(config, 10, 2, segment_lengths(torch.tensor([[1] * 4 + [2] * 6 + [0] * 2]))) == expected
    ids, segments = synthetic_rows(3, 64, 512, seed=0)
    assert ids.shape == segments.shape == (3, 64) and int((segments > 0).sum()) > 150
    bench = MfuBench(preset="tiny", sequence_length=64, batch_rows=2, steps=1, warmup_steps=1, precision="fp32",
                     compile=False, profile_steps=1)
    result = measure_mfu(bench, torch.device("cpu"), peak_flops=1e12, config=config, progress=lambda m: None)
    assert result["tokens_per_s"] > 0 and result["mfu"] == pytest.approx(result["model_tflops_per_s"])
    # The profile of the re-run steps: operators by self time, shares of the busy time.
    profile = result["profile"]
    shares = [row["share"] for row in profile["top"]]
    assert profile["top"] and shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1 + 1e-9
    assert any("addmm" in row["name"] or "mm" in row["name"] for row in profile["top"])
    assert "profile" not in measure_mfu(dataclasses.replace(bench, profile_steps=0), torch.device("cpu"),
                                        config=config, progress=lambda m: None)


def test_mfu_before_after_compares_bf16_with_fp32_and_compiled_with_eager():
    """The GPU command's before/after rows: bf16 autocast against fp32 (both eager, both on the
    dense mask), and the compiled run against eager at its precision, each ratio being its two
    measured values'; nothing when disabled. Run on CPU with the tiny preset, where bf16
    autocast also works."""
    from embedlab.bench.mfu import MfuBench, before_after

    config = model_preset("tiny", vocab_size=512)
    bench = MfuBench(preset="tiny", sequence_length=64, batch_rows=2, steps=1, warmup_steps=1, compare_steps=1)
    rows = before_after(bench, torch.device("cpu"), {"tokens_per_s": 123.0}, config=config, progress=lambda m: None)
    assert [r["name"] for r in rows] == ["opt: bf16 autocast", "opt: torch.compile blocks"]
    assert all(r["embedlab"] > 0 and r["ratio"] == pytest.approx(r["embedlab"] / r["reference"]) for r in rows)
    assert rows[1]["embedlab"] == 123.0 and rows[1]["reference"] > 0
    # Precision is compared on one attention kernel (the flash kernel takes no fp32).
    assert all("dense attention mask" in rows[0][side] for side in ("embedlab_measures", "reference_measures"))
    fp32 = before_after(dataclasses.replace(bench, precision="fp32", compile=False), torch.device("cpu"), {},
                        config=config, progress=lambda m: None)
    assert fp32 == [] and before_after(dataclasses.replace(bench, compare_steps=0), torch.device("cpu"), {}) == []


# Device names as torch.cuda.get_device_name reports them (NVIDIA's driver README lists the same
# strings), with the part and dense bf16 TFLOP/s each must get.
KNOWN_DEVICES = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM5", 989.4),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.5),
    ("NVIDIA H100 NVL", "H100 NVL", 835.5),
    ("NVIDIA H200", "H200 SXM", 989.4),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB", 312.0),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB", 312.0),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe 40GB", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 312.0),
    ("NVIDIA A10", "A10", 125.0),
    ("NVIDIA L4", "L4", 121.0),
    ("NVIDIA L40", "L40", 181.05),
    ("NVIDIA L40S", "L40S", 362.05),
]


@pytest.mark.parametrize("name, part, tflops", KNOWN_DEVICES)
def test_mfu_peak_is_chosen_by_the_exact_device_name(name, part, tflops):
    """Each reported name gets its own part's dense peak (a PCIe or NVL H100 is not the SXM part,
    an A10 is not an A100), and the JSON's "peak" record names the entry it matched."""
    from embedlab.bench.mfu import device_peak, peak_entry, resolve_peak

    entry = peak_entry(name)
    assert (entry.part, entry.dense_tflops) == (part, tflops)
    assert device_peak(name) == tflops * 1e12
    peak, record = resolve_peak(name)
    assert peak == tflops * 1e12
    assert record == {"device": name, "entry": part, "table_tflops": tflops, "table_source": entry.source,
                      "tflops": tflops, "from": "table"}
    assert "sparsity" in entry.source  # each figure says how it relates to the sheet's sparse one


@pytest.mark.parametrize("name", ["NVIDIA H100", "NVIDIA H800", "NVIDIA H20", "NVIDIA A10G", "NVIDIA A800-SXM4-80GB",
                                  "NVIDIA B200", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", "NVIDIA A100",
                                  "NVIDIA A100-SXM4-40GB MIG 1g.5gb", ""])
def test_mfu_peak_of_an_unlisted_device_is_unknown_and_needs_peak_tflops(name):
    """A name not in the table (a bare "NVIDIA H100" names no form factor; a MIG slice has a
    fraction of the SMs) has no peak; the bench then refuses, naming --peak-tflops, and takes
    the peak given there."""
    from embedlab.bench.mfu import device_peak, peak_entry, resolve_peak

    assert peak_entry(name) is None and device_peak(name) is None
    with pytest.raises(UsageError, match=r"MFU needs --peak-tflops N, the device's dense bf16"):
        resolve_peak(name)
    peak, record = resolve_peak(name, peak_tflops=500.0)
    assert peak == 500e12
    assert record == {"device": name, "entry": None, "table_tflops": None, "table_source": None, "tflops": 500.0,
                      "from": "--peak-tflops"}


def test_mfu_peak_tflops_overrides_the_table_and_the_record_keeps_both():
    """--peak-tflops wins over a known device's entry; the record shows the entry it overrode."""
    from embedlab.bench.mfu import resolve_peak

    peak, record = resolve_peak("NVIDIA H100 PCIe", peak_tflops=700.0)
    assert peak == 700e12
    assert (record["entry"], record["table_tflops"], record["tflops"], record["from"]) == (
        "H100 PCIe", 756.5, 700.0, "--peak-tflops")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_bench_mfu_refuses_without_cuda(capsys):
    """`bench mfu` on a CPU machine exits 2 saying it needs CUDA."""
    assert main(["bench", "mfu"]) == 2
    assert "needs CUDA" in capsys.readouterr().err


def test_bench_commands_parse():
    """`bench` alone runs everything; --scaling, train, contrastive, scaling and mfu parse with their defaults."""
    parser = build_parser()
    assert parser.parse_args(["bench"]).func is cmd_bench_all
    assert parser.parse_args(["bench", "--scaling", "--json"]).scaling
    train = parser.parse_args(["bench", "train", "--ablations"])
    assert train.func is cmd_bench_train and train.preset == "small" and train.ablations
    mfu = parser.parse_args(["bench", "mfu"])
    assert mfu.func is cmd_bench_mfu and (mfu.preset, mfu.sequence_length, mfu.attention) == ("300m", 512, "auto")
    # The GPU script's retry: never touches the flash kernel again.
    from embedlab.bench.mfu import MfuBench, bench_model

    assert parser.parse_args(["bench", "mfu", "--attention", "dense"]).attention == "dense"
    assert bench_model(MfuBench(attention="dense")).attention == "dense"
    assert parser.parse_args(["bench", "scaling", "--sizes", "1000", "2000"]).sizes == [1000, 2000]
    assert parser.parse_args(["bench", "contrastive"]).chunk == 16
    assert parser.parse_args(["bench", "mfu-cpu", "--presets", "small", "5m"]).presets == ["small", "5m"]
