"""Checkpoints: safetensors weights, a JSON manifest and the complete training state.

This package's own names are the checkpoint directory's format: its files, and the error for
one that is missing or corrupt. `embedlab.checkpoints.io` writes and reads checkpoints,
`embedlab.checkpoints.state` the training state a run resumes from.
"""

from __future__ import annotations

from embedlab.core.errors import UserError

FORMAT = "embedlab-checkpoint/1"
ENCODER_FILE = "encoder.safetensors"
HEAD_FILE = "mlm_head.safetensors"
MANIFEST_FILE = "manifest.json"
# A pretrained backbone's Hugging Face config (`embedlab.model.pretrained`): the architecture
# its encoder file's weights belong to, hashed with them.
HF_CONFIG_FILE = "config.json"


class CheckpointError(UserError, ValueError):
    """A checkpoint directory is missing, incomplete or corrupt; the message names the file."""
