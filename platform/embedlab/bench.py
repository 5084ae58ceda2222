"""`embedlab bench`: measurements against a reference taken in the same run.

Machines here are noisy, so every comparison reports both measured values and their
ratio, never a number alone. `bench_all` runs every comparison and returns one list
(`embedlab.bench_measure.Comparison`); the parts live in `bench_train` (phase-1
throughput, peak memory, optimisations on/off), `bench_contrastive` (GradCache),
`bench_scaling` (length and corpus size), `bench_mfu` (CUDA only) and here (data, eval).

`bench data`: packed non-padding tokens per second through embedlab's Ray Data pipeline
(read -> tokenize -> pack, the same UDFs training uses) next to raw `tokenizers`
`encode_batch` in this process on the same documents. Both are measured after a warm-up
pass, so Ray worker start-up is excluded; the pipeline's extra work (chunking, packing,
Arrow conversion, scheduling) is included.
"""

from __future__ import annotations

import time
from collections.abc import Callable


from embedlab.bench_measure import Comparison
from embedlab.config import DataConfig
from embedlab.data.document import document_texts
from embedlab.data.prepare import prepare_data
from embedlab.data.stream import pack_batch, tokenize_pieces


def _pipeline_tokens(table, tokenizer_path: str, sequence_length: int, pad_id: int, sources: list[str]) -> tuple[int, int]:
    import ray.data

    dataset = (
        ray.data.from_arrow(table)
        .map_batches(
            tokenize_pieces,
            fn_kwargs={"tokenizer_path": tokenizer_path, "sequence_length": sequence_length, "sources": sources},
            batch_format="pyarrow", batch_size=4096, num_cpus=0.5,
        )
        .map_batches(
            pack_batch, fn_kwargs={"sequence_length": sequence_length, "pad_id": pad_id},
            batch_format="pyarrow", batch_size=4096, num_cpus=0.5,
        )
    )
    tokens = positions = 0
    for batch in dataset.iter_batches(batch_size=None, batch_format="numpy"):
        tokens += int((batch["segment_ids"] > 0).sum())
        positions += int(batch["segment_ids"].size)
    return tokens, positions


def bench_data(
    documents: int = 20000, config: DataConfig | None = None, progress: Callable[[str], None] = print
) -> dict:
    prepared = prepare_data(config or DataConfig(), progress=progress)
    sources = list(prepared.record["mixture"]["shares"])
    table = prepared.corpus.read(split="train", sources=sources).sort_by("hash").slice(0, documents)
    tokenizer = prepared.tokenizer
    length = prepared.record["sequence_length"]
    texts = document_texts(table)
    progress(f"bench data: {table.num_rows:,} training documents, warm-up pass")
    _pipeline_tokens(table.slice(0, 500), str(tokenizer.path), length, tokenizer.pad_id, sources)
    tokenizer.tokenizer.encode_batch(texts[:500], add_special_tokens=False)

    started = time.perf_counter()
    raw_tokens = sum(len(e.ids) for e in tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False))
    raw_seconds = time.perf_counter() - started
    started = time.perf_counter()
    packed_tokens, positions = _pipeline_tokens(table, str(tokenizer.path), length, tokenizer.pad_id, sources)
    pipeline_seconds = time.perf_counter() - started
    embedlab_rate, reference_rate = packed_tokens / pipeline_seconds, raw_tokens / raw_seconds
    return {
        "documents": table.num_rows,
        "sequence_length": length,
        "comparisons": [
            {
                "name": "data: tokens per second",
                "embedlab": embedlab_rate,
                "embedlab_measures": "Ray Data read -> tokenize -> pack, packed non-padding tokens (SEP included)",
                "reference": reference_rate,
                "reference_measures": "tokenizers encode_batch in one process, tokens",
                "ratio": embedlab_rate / reference_rate,
                "unit": "tokens/s",
            }
        ],
        "packing_efficiency": packed_tokens / max(positions, 1),
        "seconds": {"embedlab": pipeline_seconds, "reference": raw_seconds},
        "tokens": {"embedlab": packed_tokens, "reference": raw_tokens},
    }


def format_bench(result: dict) -> str:
    lines = [f"{'comparison':<26} {'embedlab':>12} {'reference':>12} {'ratio':>7}  unit"]
    for c in result["comparisons"]:
        lines.append(f"{c['name']:<26} {c['embedlab']:>12,.0f} {c['reference']:>12,.0f} {c['ratio']:>7.3f}  {c['unit']}")
    lines += [
        "",
        f"embedlab:  {result['comparisons'][0]['embedlab_measures']}",
        f"reference: {result['comparisons'][0]['reference_measures']}",
        f"{result['documents']:,} documents; packing efficiency {result['packing_efficiency']:.4f}",
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
    return [Comparison(**{k: c[k] for k in keys}, better="lower" if c["unit"] == "s" else "higher")
            for c in result["comparisons"]]


def bench_all(config: DataConfig | None = None, *, train=None, contrastive=None, data_documents: int = 20000,
              compile_model: bool = True, progress: Callable[[str], None] = print) -> dict:
    """Every comparison in one run: {"comparisons": [...], "notes": [...]}.

    MFU is measured only where CUDA is available (`bench mfu`); elsewhere a note says so.
    """
    import torch

    from embedlab.bench_contrastive import ContrastiveBench, bench_contrastive
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
    notes.append(f"data: {data['documents']:,} documents; packing efficiency {data['packing_efficiency']:.4f}")
    evaluation = bench_eval(progress=progress)
    comparisons += _as_comparisons(evaluation)
    comparisons.append(Comparison(
        name="eval: nDCG@10", embedlab=evaluation["ndcg@10"]["embedlab"],
        reference=evaluation["ndcg@10"]["reference"], unit="nDCG@10", better="higher",
        embedlab_measures="embedlab evaluator's nDCG@10", reference_measures="InformationRetrievalEvaluator's",
    ))
    notes.append(f"eval: all-MiniLM-L6-v2 on {evaluation['task']}/{evaluation['split']}: "
                 f"{evaluation['queries']} queries, {evaluation['docs']} documents")
    if torch.cuda.is_available():
        from embedlab.bench_mfu import bench_mfu

        mfu = bench_mfu(progress=progress)
        comparisons.append(mfu_comparison(mfu))
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
        reference_measures="dense bf16 peak of the device",
    )
