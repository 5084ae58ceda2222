"""The files of a checkpoint directory, and the error for one that is missing or corrupt.

Kept apart from `embedlab.train.checkpoint` so the training state's reader and writer
(`embedlab.train.state`), which the checkpoint writer calls, can name them without importing it.
"""

from __future__ import annotations

from embedlab.errors import UserError

FORMAT = "embedlab-checkpoint/1"
ENCODER_FILE = "encoder.safetensors"
HEAD_FILE = "mlm_head.safetensors"
MANIFEST_FILE = "manifest.json"


class CheckpointError(UserError, ValueError):
    """A checkpoint directory is missing, incomplete or corrupt; the message names the file."""
