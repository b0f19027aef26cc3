"""Plain-text tables for the commands that print them (`ps`, `gpus`): no rich, whose import
alone costs more than such a command may take (docs/benchmarks/cli.md)."""

from __future__ import annotations

from collections.abc import Collection, Sequence


def lines(
    header: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int] = ()
) -> list[str]:
    """The header and the rows, each column as wide as its widest cell, two spaces apart;
    the columns numbered in `right` right-aligned."""
    cells = [list(header), *(list(row) for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return [
        "  ".join(
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in cells
    ]
