"""The names of the built-in pair builders, in registry order.

A leaf module so that `config` can refuse a user's pair source named like a built-in builder
without importing the builders themselves (which import the corpus, which imports `config`).
`data.pairs.PAIR_BUILDERS` maps exactly these names to their functions.
"""

BUILDER_NAMES: tuple[str, ...] = (
    "same-source-spans", "title-body", "term-definition", "synonyms", "lead-rest", "keyword",
)
