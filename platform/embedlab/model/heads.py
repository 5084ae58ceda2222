"""One encoder, several MLM heads: the model of the dual-LM-head method.

Each row (sequence) of a batch is routed to exactly one head by a (B,) `head_index`; the
encoder runs once for the whole batch and every head sees only the hidden states at the
selected positions of its own rows (the method: a 5%-masked and a 50%-masked task share
the encoder but not the prediction head).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from embedlab.core.config import ModelConfig
from embedlab.model.encoder import Encoder, MLMHead, SegmentLayout, selected_positions, selected_states


def _is_tied_decoder(key: str) -> bool:
    """`<name>.embedding.*` in a heads state dict: the encoder's embedding table, seen through
    the tie. Head checkpoints leave it out; the encoder state holds it once."""
    return key.split(".", 1)[-1].startswith("embedding.")


def select_by_head(
    values: torch.Tensor, selected: torch.Tensor, head_index: torch.Tensor, head_names: Sequence[str]
) -> dict[str, torch.Tensor]:
    """Split the selected entries of (B, T, ...) `values` by the head each row is routed to.

    `selected` (B, T) bool; `head_index` (B,) integer in [0, len(head_names)). Returns, per
    name, the (N_h, ...) entries of `values` at the selected positions of that head's rows in
    row-major order: the order of `values[selected]` with other heads' rows left out. Model
    logits and loss targets are both gathered here, so they line up by construction.
    """
    return {name: values[rows] for name, rows in _head_masks(selected, head_index, head_names).items()}


def route_positions(
    selected: torch.Tensor, head_index: torch.Tensor, head_names: Sequence[str]
) -> dict[str, torch.Tensor]:
    """`select_by_head` as flat positions: {name: (N_h,) long row-major indices into the (B, T)
    batch of the selected positions of that head's rows}, in the same order. A training step
    routes on the host and sends the positions, so a GPU never reads a mask's count back."""
    return {name: selected_positions(rows) for name, rows in _head_masks(selected, head_index, head_names).items()}


def _head_masks(
    selected: torch.Tensor, head_index: torch.Tensor, head_names: Sequence[str]
) -> dict[str, torch.Tensor]:
    """{name: (B, T) bool, the selected positions of that head's rows}, after checking `head_index`."""
    batch = selected.shape[0]
    if head_index.shape != (batch,) or head_index.dtype.is_floating_point:
        raise ValueError(f"head_index: expected an integer tensor of shape ({batch},), "
                         f"got {head_index.dtype} {tuple(head_index.shape)}")
    # An out-of-range index would silently drop its rows from every head and from the loss.
    if bool(((head_index < 0) | (head_index >= len(head_names))).any()):
        raise ValueError(f"head_index: values must be in [0, {len(head_names)}) for heads {list(head_names)}")
    return {name: selected & (head_index == index)[:, None] for index, name in enumerate(head_names)}


class MultiHeadMLMModel(nn.Module):
    """Encoder + one `MLMHead` per name; with one name it computes exactly what `MLMModel` does.

    Parameters are `encoder.*` (the same names as in `MLMModel`) and `heads.<name>.*`.

    What each head owns, and why the decoder stays tied. Every head has its own dense
    transform, LayerNorm and vocabulary bias; the (V, d) decoder of every head is the input
    embedding table. The recipe reports that the input embeddings of models trained at 6%
    and 50% masking are almost identical while their LM heads take clearly different shapes
    (the low-ratio head's singular values are more concentrated). So the ratio-specific part
    is put where the regimes differ, in the transform, norm and bias, and the part that
    agrees across regimes is shared. Tying keeps the cost of each extra head at
    d^2 + 3d + V parameters (dense d^2 + d, norm 2d, bias V; 1.1M on the 300m preset) instead
    of an extra V*d decoder (50M there), and it keeps one embedding space: every head scores
    against the table the encoder reads its inputs from, so no head drifts into a private
    output vocabulary that the inference-time encoder never sees.
    """

    def __init__(self, config: ModelConfig, head_names: Sequence[str]) -> None:
        super().__init__()
        head_names = tuple(head_names)
        if not head_names or len(set(head_names)) != len(head_names):
            raise ValueError(f"head_names: need one or more distinct names, got {list(head_names)}")
        self.head_names = head_names
        # Construction order (encoder, then heads) matches MLMModel, so one seed gives one init.
        self.encoder = Encoder(config)
        self.heads = nn.ModuleDict({name: MLMHead(config, self.encoder.embed) for name in head_names})

    def forward(
        self,
        input_ids: torch.Tensor,
        segment_ids: torch.Tensor,
        selected: torch.Tensor | Mapping[str, torch.Tensor],
        head_index: torch.Tensor | None = None,
        layout: SegmentLayout | None = None,
    ) -> dict[str, torch.Tensor]:
        """(B, T) ids, (B, T) segments, and the selected positions: a (B, T) bool mask with
        (B,) `head_index`, one head per row, or already routed on the host as {name: (N_h,)
        flat positions} (`route_positions`) -> {name: (N_h, V) logits at the selected
        positions of that head's rows, row-major}. `layout`: as `Encoder.forward` takes it.

        Every name is present; a head with no selected position gets a (0, V) tensor.
        """
        hidden = self.encoder(input_ids, segment_ids, layout)  # (B, T, d), one pass for all heads
        if isinstance(selected, Mapping):
            routed = {name: selected_states(hidden, selected[name]) for name in self.head_names}
        else:
            routed = select_by_head(hidden, selected, head_index, self.head_names)
        return {name: self.heads[name](routed[name]) for name in self.head_names}

    def encoder_state(self) -> dict[str, torch.Tensor]:
        """The encoder alone, keyed as `Encoder.state_dict()`: the inference package's weights."""
        return self.encoder.state_dict()

    def heads_state(self) -> dict[str, torch.Tensor]:
        """Every head's own parameters as `<name>.<parameter>`, without the tied decoder."""
        return {
            key: value
            for key, value in self.heads.state_dict().items()
            if not _is_tied_decoder(key)
        }

    def load_heads_state(self, state: dict[str, torch.Tensor]) -> None:
        """Inverse of `heads_state`. Keys are checked before anything is copied: a missing,
        unexpected or tied-decoder key (which would overwrite the encoder's embedding table
        through the tie) is an error and leaves the heads unchanged."""
        expected = set(self.heads_state())
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if missing or unexpected:
            raise KeyError(f"heads state: missing {missing}, unexpected {unexpected}")
        # Not strict only because the tied decoder keys are deliberately absent.
        self.heads.load_state_dict(state, strict=False)
