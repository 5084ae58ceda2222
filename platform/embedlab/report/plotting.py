"""What every report figure is: a PNG and a caption in four parts, drawn with matplotlib (Agg)."""

from __future__ import annotations

import io
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")  # no display: figures are rendered straight to PNG bytes

import matplotlib.pyplot as plt  # noqa: E402

WIDTH_INCHES = 11.0  # 1100 px at DPI: the report's content width
DPI = 100
PALETTE = plt.get_cmap("tab10").colors
STYLE = {"font.size": 9, "axes.titlesize": 10, "axes.spines.top": False, "axes.spines.right": False,
         "legend.fontsize": 8, "legend.frameon": False}


@dataclass(frozen=True)
class Caption:
    """The four things every figure of the report must say, each its own field."""

    units: str  # units of every axis and the population the numbers come from
    observed: str  # values read from these runs
    mechanism: str  # why the values look the way they do
    limitation: str  # what the figure cannot show


@dataclass(frozen=True)
class Figure:
    key: str  # the HTML id
    title: str
    png: bytes
    caption: Caption


def style():
    """The report's matplotlib settings, for the duration of a `with` block."""
    return plt.rc_context(STYLE)


def new_figure(rows: int = 1, cols: int = 1, *, height: float = 3.2, **kwargs):
    """A figure the report's width, `height` inches per row of axes (axes always 2-D)."""
    return plt.subplots(rows, cols, figsize=(WIDTH_INCHES, height * rows), squeeze=False,
                        layout="constrained", **kwargs)


def new_mosaic(layout: list[list[str]], *, height: float, **kwargs):
    """A figure the report's width with named axes laid out as `layout` (plt.subplot_mosaic)."""
    figure = plt.figure(figsize=(WIDTH_INCHES, height), layout="constrained")
    return figure, figure.subplot_mosaic(layout, **kwargs)


def to_png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    plt.close(figure)
    return buffer.getvalue()


def color(index: int) -> tuple[float, float, float]:
    return PALETTE[index % len(PALETTE)]


def grid(count: int, cols: int) -> tuple[int, int]:
    """Rows and columns of small multiples for `count` panels, at most `cols` wide."""
    cols = max(1, min(cols, count))
    return -(-count // cols), cols


def hide_unused(axes, used: int) -> None:
    for ax in axes.flat[used:]:
        ax.set_visible(False)
