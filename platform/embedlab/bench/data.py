"""`embedlab bench data`: packed non-padding tokens per second through embedlab's Ray Data pipeline
(the corpus's documents as blocks -> tokenize -> pack: the stage `prepare` runs, then the
packing UDF) next to raw `tokenizers` `encode_batch` in this process on the same
documents. Both are medians of interleaved passes after a full warm-up pass, so Ray worker
start-up is excluded; the pipeline's extra work (chunking, packing, Arrow conversion,
scheduling) is included.
"""

from __future__ import annotations

from collections.abc import Callable

from embedlab.bench.measure import interleaved_rates, median
from embedlab.core.config import DataConfig
from embedlab.prepared.build import prepare_data
from embedlab.sources.document import document_texts
from embedlab.streams.packed import pack_batch
from embedlab.prepared.pieces import tokenize_dataset


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
