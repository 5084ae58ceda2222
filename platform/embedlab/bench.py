"""`embedlab bench`: measurements against a reference taken in the same run.

Machines here are noisy, so every comparison reports both measured values and their
ratio, never a number alone. `bench_all` runs every comparison and returns one list
(`embedlab.bench_measure.Comparison`); the parts live in `bench_train` (phase-1
throughput, peak memory, optimisations on/off), `bench_contrastive` (GradCache),
`bench_scaling` (length and corpus size), `bench_prefetch` (data prefetch), `bench_mfu` (CUDA
only), `bench_cpu_mfu` (training FLOP/s against this CPU's measured matmul peak) and here
(data, eval).

`bench data`: packed non-padding tokens per second through embedlab's Ray Data pipeline
(the corpus's documents as blocks -> tokenize -> pack: the stage `prepare` runs, then the
packing UDF) next to raw `tokenizers` `encode_batch` in this process on the same
documents. Both are medians of interleaved passes after a full warm-up pass, so Ray worker
start-up is excluded; the pipeline's extra work (chunking, packing, Arrow conversion,
scheduling) is included.
"""

from __future__ import annotations

import time
from collections.abc import Callable


from embedlab.bench_measure import Comparison, interleaved_rates, median
from embedlab.config import DataConfig
from embedlab.data.document import document_texts
from embedlab.data.prepare import prepare_data
from embedlab.data.stream import pack_batch, tokenize_dataset


def _pipeline_tokens(table, tokenizer_path: str, sequence_length: int, pad_id: int, sources: list[str]) -> tuple[int, int]:
    dataset = tokenize_dataset(
        table, tokenizer_path=tokenizer_path, sequence_length=sequence_length, sources=sources
    ).map_batches(
        pack_batch, fn_kwargs={"sequence_length": sequence_length, "pad_id": pad_id},
        batch_format="pyarrow", batch_size=None, num_cpus=1,
    )
    tokens = positions = 0
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        tokens += int((batch["segment_ids"] > 0).sum())
        positions += int(batch["segment_ids"].size)
    return tokens, positions


def bench_data(
    documents: int | None = None, config: DataConfig | None = None, repeats: int = 3,
    progress: Callable[[str], None] = print,
) -> dict:
    """Packed tokens/s through the pipeline and raw `encode_batch` tokens/s: medians of
    `repeats` interleaved passes, after one full warm-up pass of each (a smaller warm-up
    leaves Ray workers to start inside the timed passes). `documents=None` takes the whole
    training split, what `prepare` tokenises; a few thousand documents mostly measure Ray
    Data's fixed cost per execution (about 0.1-0.7 s here)."""
    if repeats < 1 or (documents is not None and documents < 1):
        raise ValueError(f"bench data needs repeats >= 1 and documents >= 1, got {repeats} and {documents}")
    prepared = prepare_data(config or DataConfig(), progress=progress)
    sources = list(prepared.record["mixture"]["shares"])
    table = prepared.corpus.read(split="train", sources=sources).sort_by("hash")
    table = table if documents is None else table.slice(0, documents)
    tokenizer = prepared.tokenizer
    length = prepared.record["sequence_length"]
    texts = document_texts(table)
    counted: dict[str, int] = {}

    def raw() -> int:
        counted["reference"] = sum(len(e.ids) for e in tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False))
        return counted["reference"]

    def pipeline() -> int:
        counted["embedlab"], counted["positions"] = _pipeline_tokens(
            table, str(tokenizer.path), length, tokenizer.pad_id, sources)
        return counted["embedlab"]

    progress(f"bench data: {table.num_rows:,} training documents, a warm-up pass, then {repeats} timed passes")
    raw(), pipeline()
    rates = interleaved_rates({"embedlab": pipeline, "reference": raw}, repeats)
    embedlab_rate, reference_rate = median(rates["embedlab"]), median(rates["reference"])
    return {
        "documents": table.num_rows,
        "sequence_length": length,
        "repeats": repeats,
        "comparisons": [
            {
                "name": "data: tokens per second",
                "embedlab": embedlab_rate,
                "embedlab_measures": "Ray Data: documents in blocks -> tokenize -> pack, packed non-padding tokens (SEP included)",
                "reference": reference_rate,
                "reference_measures": "tokenizers encode_batch in one process, tokens",
                "ratio": embedlab_rate / reference_rate,
                "unit": "tokens/s",
                "runs": {side: rates[side] for side in ("embedlab", "reference")},
            }
        ],
        "pass_ratios": [e / r for e, r in zip(rates["embedlab"], rates["reference"])],
        "packing_efficiency": counted["embedlab"] / max(counted["positions"], 1),
        "seconds": {"embedlab": counted["embedlab"] / embedlab_rate, "reference": counted["reference"] / reference_rate},
        "tokens": {"embedlab": counted["embedlab"], "reference": counted["reference"]},
    }


def data_note(result: dict) -> str:
    """What a `bench data` result measured, and every pass's ratio."""
    return (f"{result['documents']:,} documents; packing efficiency {result['packing_efficiency']:.4f}; "
            f"median of {result['repeats']} passes, ratio per pass "
            + ", ".join(f"{r:.2f}" for r in result["pass_ratios"]))


def format_bench(result: dict) -> str:
    lines = [f"{'comparison':<26} {'embedlab':>12} {'reference':>12} {'ratio':>7}  unit"]
    for c in result["comparisons"]:
        lines.append(f"{c['name']:<26} {c['embedlab']:>12,.0f} {c['reference']:>12,.0f} {c['ratio']:>7.3f}  {c['unit']}")
    lines += [
        "",
        f"embedlab:  {result['comparisons'][0]['embedlab_measures']}",
        f"reference: {result['comparisons'][0]['reference_measures']}",
        data_note(result),
    ]
    return "\n".join(lines)


def bench_eval(split: str = "dev", progress: Callable[[str], None] = print) -> dict:
    """The evaluator's time to score all-MiniLM-L6-v2 on the built-in task next to
    sentence-transformers' `InformationRetrievalEvaluator` on the same model, task and split,
    with both nDCG@10 values. Models are loaded before either clock starts."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    from embedlab.evaluate.baselines import MiniLM, minilm_path
    from embedlab.evaluate.beir import load_task
    from embedlab.evaluate.retrieval import evaluate_encoder

    prepared = prepare_data(DataConfig(), progress=progress)
    task = load_task(prepared.task_dir("python-docstrings"))
    ours = MiniLM(device="cpu")
    reference_model = SentenceTransformer(str(minilm_path()), device="cpu")
    queries = task.split_queries(split)
    relevant = {q: {d for d, grade in task.qrels[split][q].items() if grade > 0} for q in queries}
    evaluator = InformationRetrievalEvaluator(
        queries=queries, corpus={d: task.doc_text(d) for d in task.corpus}, relevant_docs=relevant,
        ndcg_at_k=[10], mrr_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[100], map_at_k=[100],
        batch_size=64, show_progress_bar=False,
    )
    progress(f"bench eval: all-MiniLM-L6-v2 on python-docstrings/{split}: {len(queries)} queries, {len(task.corpus)} documents")
    started = time.perf_counter()
    metrics = evaluate_encoder(ours.encode, task, split)
    ours_seconds = time.perf_counter() - started
    started = time.perf_counter()
    reference = evaluator(reference_model)
    reference_seconds = time.perf_counter() - started
    reference_ndcg = next(v for k, v in reference.items() if k.endswith("ndcg@10"))
    return {
        "task": task.name, "split": split, "queries": len(queries), "docs": len(task.corpus),
        "comparisons": [{
            "name": "eval: seconds per task",
            "embedlab": ours_seconds,
            "embedlab_measures": "embedlab evaluator: length-sorted encoding, Faiss IndexFlatIP, trec_eval metrics + health",
            "reference": reference_seconds,
            "reference_measures": "sentence-transformers InformationRetrievalEvaluator (same model, cosine)",
            "ratio": ours_seconds / reference_seconds,
            "unit": "s",
        }],
        "ndcg@10": {"embedlab": metrics["ndcg@10"], "reference": float(reference_ndcg)},
    }


def format_bench_eval(result: dict) -> str:
    c = result["comparisons"][0]
    return "\n".join([
        f"{'comparison':<26} {'embedlab':>10} {'reference':>10} {'ratio':>7}  unit",
        f"{c['name']:<26} {c['embedlab']:>10.2f} {c['reference']:>10.2f} {c['ratio']:>7.3f}  {c['unit']}",
        f"{'nDCG@10':<26} {result['ndcg@10']['embedlab']:>10.4f} {result['ndcg@10']['reference']:>10.4f}",
        "",
        f"embedlab:  {c['embedlab_measures']}",
        f"reference: {c['reference_measures']}",
        f"{result['task']}/{result['split']}: {result['queries']} queries, {result['docs']} documents",
    ])


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
    import torch

    from embedlab.bench_contrastive import ContrastiveBench, bench_contrastive
    from embedlab.bench_cpu_mfu import CpuMfuBench, bench_cpu_mfu, cpu_mfu_comparisons, cpu_mfu_notes
    from embedlab.bench_prefetch import bench_prefetch, prefetch_note
    from embedlab.bench_train import TrainBench, bench_train, train_notes

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
        from embedlab.bench_mfu import bench_mfu, peak_entry

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
