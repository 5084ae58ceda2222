"""embedlab: train text-embedding encoders and run controlled ablations on Ray."""

__version__ = "0.1.0"

from embedlab.sweep.study import Search, Study  # noqa: E402
from embedlab.sweep.table import load_table  # noqa: E402

__all__ = ["Search", "Study", "load_table", "__version__"]
