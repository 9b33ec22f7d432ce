"""What every bench plot module shares: matplotlib imported only when a plot is drawn, and saving.

compare/plots.py and trace/plots.py both draw with these, so neither imports the other.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

Reports = dict[str, dict[str, Any]]  # {engine: report}


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    pyplot().close(fig)
    return path
