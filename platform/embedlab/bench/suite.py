"""`embedlab bench`: measurements against a reference taken in the same run.

Machines here are noisy, so every comparison reports both measured values and their
ratio, never a number alone. `bench_all` runs every comparison and returns one list
(`embedlab.bench.measure.Comparison`); the parts live in `bench.train` (phase-1
throughput, peak memory, optimisations on/off), `bench.contrastive` (GradCache),
`bench.data` (the data pipeline), `bench.prefetch` (data prefetch), `bench.evaluation`
(the evaluator), `bench.mfu` (CUDA only) and `bench.cpu_mfu` (training FLOP/s against this
CPU's measured matmul peak); `bench.scaling` (length and corpus size) runs on its own.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from embedlab.bench.contrastive import ContrastiveBench, bench_contrastive
from embedlab.bench.cpu_mfu import CpuMfuBench, bench_cpu_mfu, cpu_mfu_comparisons, cpu_mfu_notes
from embedlab.bench.data import bench_data, data_note
from embedlab.bench.evaluation import bench_eval
from embedlab.bench.measure import Comparison
from embedlab.bench.mfu import bench_mfu, peak_entry
from embedlab.bench.prefetch import bench_prefetch, prefetch_note
from embedlab.bench.train import TrainBench, bench_train, train_notes
from embedlab.core.config import DataConfig
from embedlab.prepared.build import prepare_data


def _as_comparisons(result: dict) -> list[Comparison]:
    """`bench data` / `bench eval` results (plain dicts) as comparisons; lower is better for seconds."""
    keys = ("name", "embedlab", "reference", "unit", "embedlab_measures", "reference_measures")
    return [Comparison(**{k: c[k] for k in keys}, runs=c.get("runs", {}),
                       better="lower" if c["unit"] == "s" else "higher")
            for c in result["comparisons"]]


def bench_all(config: DataConfig | None = None, *, train=None, contrastive=None, cpu_mfu=None,
              data_documents: int | None = None, compile_model: bool = True,
              progress: Callable[[str], None] = print) -> dict:
    """Every comparison in one run: {"comparisons": [...], "notes": [...]}.

    GPU MFU is measured only where CUDA is available (`bench mfu`); elsewhere a note says so.
    The CPU's (`bench mfu-cpu`) is measured everywhere.
    """
    config = config or DataConfig()
    prepared = prepare_data(config, progress=progress)
    trained = bench_train(prepared, train or TrainBench(), ablations=True, compile_model=compile_model,
                          progress=progress)
    comparisons = list(trained["comparisons"])
    notes = train_notes(trained)
    contrastive_result = bench_contrastive(prepared, contrastive or ContrastiveBench(), progress=progress)
    comparisons += contrastive_result["comparisons"]
    data = bench_data(documents=data_documents, config=config, progress=progress)
    comparisons += _as_comparisons(data)
    notes.append(f"data: {data_note(data)}")
    prefetch = bench_prefetch(prepared, config, progress=progress)
    comparisons += prefetch["comparisons"]
    notes.append(f"prefetch: {prefetch_note(prefetch)}")
    evaluation = bench_eval(progress=progress)
    comparisons += _as_comparisons(evaluation)
    comparisons.append(Comparison(
        name="eval: nDCG@10", embedlab=evaluation["ndcg@10"]["embedlab"],
        reference=evaluation["ndcg@10"]["reference"], unit="nDCG@10", better="higher",
        embedlab_measures="embedlab evaluator's nDCG@10", reference_measures="InformationRetrievalEvaluator's",
    ))
    notes.append(f"eval: all-MiniLM-L6-v2 on {evaluation['task']}/{evaluation['split']}: "
                 f"{evaluation['queries']} queries, {evaluation['docs']} documents")
    measured_cpu = bench_cpu_mfu(cpu_mfu or CpuMfuBench(), progress=progress)
    comparisons += cpu_mfu_comparisons(measured_cpu)
    notes += cpu_mfu_notes(measured_cpu)
    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
        if peak_entry(device) is None:  # `bench` takes no --peak-tflops: say where to give it
            notes.append(f"mfu: not measured: no dense bf16 peak is known for {device!r}; "
                         "run `embedlab bench mfu --peak-tflops N` (the device's dense bf16 TFLOP/s)")
        else:
            mfu = bench_mfu(progress=progress)
            comparisons.append(mfu_comparison(mfu))
            comparisons += _as_comparisons({"comparisons": mfu["before_after"]})
    else:
        notes.append("mfu: not measured (needs CUDA); workers/bench-gpu.sh measures the 300m preset at L=512 in bf16")
    return {"comparisons": comparisons, "notes": notes}


def mfu_comparison(mfu: dict) -> Comparison:
    """MFU as a comparison: achieved model TFLOP/s against the device's peak, ratio = MFU."""
    bench = mfu["bench"]
    return Comparison(
        name="mfu: model TFLOP/s vs peak", embedlab=mfu["model_tflops_per_s"], reference=mfu["peak_tflops_per_s"],
        unit="TFLOP/s", better="higher",
        embedlab_measures=f"phase-1 step, preset {bench['preset']}, L={bench['sequence_length']}, {bench['precision']}, "
                          f"{mfu['tokens_per_s']:,.0f} tokens/s on {mfu['device']}",
        reference_measures=f"dense bf16 peak of the device ({mfu['peak']['entry'] or mfu['peak']['from']}: "
                           f"{mfu['peak']['tflops']:g} TFLOP/s)",
    )
