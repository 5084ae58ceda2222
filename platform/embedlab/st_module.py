"""The stable import path of `EmbedlabTransformer`, the class every release's `modules.json` names.

The class lives in `embedlab.release.st_module`, beside the export that writes releases. This
name stays because sentence-transformers imports a module class by the dotted path a package
recorded: releases written before the move name `embedlab.st_module.EmbedlabTransformer`, and
new ones keep naming it so that a release loads with any embedlab version that has the class.
"""

from embedlab.release.st_module import EmbedlabTransformer

__all__ = ["EmbedlabTransformer"]
