"""The text a student sees of a longer one: the cut that teacher labels and teacher embeddings
share, so that a teacher judges or encodes exactly what the student reads, never a longer
text. Its own module so that each teacher set's code identity names the cut, and not the other
set's code."""

from __future__ import annotations


def cut_to_tokens(tokenizer, text: str, *, prefix: str, max_tokens: int) -> str:
    """The longest start of `text` ending at a token boundary whose `prefix + text` the
    tokenizer (a `FrozenTokenizer`) encodes in at most `max_tokens` tokens ('' when even the
    prefix does not fit)."""
    encoding = tokenizer.tokenizer.encode(prefix + text, add_special_tokens=False)
    if len(encoding.ids) <= max_tokens:
        return text
    keep = max_tokens
    while keep > 0:
        end = encoding.offsets[keep - 1][1] - len(prefix)
        cut = text[:max(end, 0)].rstrip()
        # A word cut short may re-tokenise into more pieces than it held in context: step back.
        if len(tokenizer.encode_batch([prefix + cut])[0]) <= max_tokens:
            return cut
        keep -= 1
    return ""
