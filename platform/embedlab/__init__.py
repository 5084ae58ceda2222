"""embedlab: train text-embedding encoders and run controlled ablations on Ray."""

from embedlab.code_identity import VERSION as __version__
from embedlab.config import Budget
from embedlab.sweep.study import Search, Study
from embedlab.sweep.table import load_table

__all__ = ["Budget", "Search", "Study", "load_table", "__version__"]
