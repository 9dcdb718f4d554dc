"""Tables for the book's pages: a caption, a header, escaped cells, and a width that fits a phone."""
from __future__ import annotations





# --- the encoding zoo (chapter 9)
class Table:
    """A table that a notebook shows as HTML (in the web book) and ``print`` shows as aligned text.

    A thin layer over pandas (its ``DataFrame`` for text, its ``Styler`` for HTML), so every printed
    table of the book looks the same: no index column, a caption above, the column's width at the page's.

    Args:
        header: column titles.
        cells: rows, one value per column (formatted with ``str``).
        caption: a line above the table.

    Raises:
        ValueError: a row whose length differs from the header's.
    """

    def __init__(self, header, cells, caption: str = ""):
        import pandas as pd

        self.header = [str(h) for h in header]
        self.cells = [[str(c) for c in row] for row in cells]
        for i, row in enumerate(self.cells):
            if len(row) != len(self.header):
                raise ValueError(f"row {i} has {len(row)} cells; the header has {len(self.header)}")
        self.caption = caption
        self.frame = pd.DataFrame(self.cells, columns=self.header)

    @classmethod
    def from_rows(cls, rows: list[dict], caption: str = "") -> "Table":
        """A table of ``rows``, one dict per row with the same keys (the column titles, in order)."""
        if not rows:
            raise ValueError("rows must hold at least one row")
        header = list(rows[0])
        return cls(header, [[row[h] for h in header] for row in rows], caption)

    def __str__(self) -> str:
        text = self.frame.to_string(index=False, justify="left")
        return f"{self.caption}\n{text}" if self.caption else text

    __repr__ = __str__

    def _repr_html_(self) -> str:
        styler = (self.frame.style.hide(axis="index").format(escape="html")
                  .set_table_attributes('class="lengthgen-table"'))
        if self.caption:
            styler = styler.set_caption(self.caption)
        return f'<div style="overflow-x:auto">{styler.to_html()}</div>'
