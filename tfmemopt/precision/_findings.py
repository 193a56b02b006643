"""Findings: the advice objects that `tfmemopt.check_*` functions return.

A `Finding` is one piece of advice about one layer; `Findings` is a list of
them that prints as one line each, or as a table with `table()`. Also the
small helpers the checks share: `pad_to_multiple` and `walk_layers`.
"""

from __future__ import annotations

import dataclasses

import keras

from tfmemopt._compat import sublayers
from tfmemopt._utils import check_int


@dataclasses.dataclass(frozen=True)
class Finding:
    """One piece of advice about one layer (or the model, or the batch).

    Args:
        code: String, what kind of finding: `"output-16bit"`,
            `"softmax-16bit"`, `"no-loss-scaling"`, `"needless-float32"`,
            `"bf16-step-lost"`, `"bf16-update-lossy"` or `"alignment"`.
        severity: String, `"warning"` (numerics or a clear slowdown) or
            `"info"` (a smaller gain).
        layer: String, the layer's name (or `"<model>"`, `"<batch>"`).
        message: String, what is wrong and how to fix it.
        attribute: String, defaults to `None`. The setting concerned
            (`"units"`, `"vocabulary"`...).
        value: Int, defaults to `None`. Its current value.
        suggested: Int, defaults to `None`. The value suggested.
        cost_pct: Float, defaults to `None`. Padding cost of `suggested`, in
            % of `value`.
    """

    code: str
    severity: str
    layer: str
    message: str
    attribute: str | None = None
    value: int | None = None
    suggested: int | None = None
    cost_pct: float | None = None

    def __str__(self) -> str:
        return f"[{self.severity}] {self.layer}: {self.message}"


class Findings(list):
    """A list of `Finding`, printable as lines or as a table.

    Example:

    >>> print(Findings())
    No findings.
    """

    @property
    def codes(self) -> list[str]:
        """The code of each finding, in order."""
        return [f.code for f in self]

    def __str__(self) -> str:
        if not self:
            return "No findings."
        return "\n".join(str(f) for f in self)

    def table(self, markdown: bool = False) -> str:
        """The findings as an aligned text (or Markdown) table.

        Args:
            markdown: Bool, defaults to `False`. Markdown instead of text.

        Returns:
            A string; `"No findings."` when empty.
        """
        if not self:
            return "No findings."
        headers = ["severity", "code", "layer", "setting", "value"]
        headers += ["suggested", "cost %", "advice"]
        rows = [
            [
                f.severity,
                f.code,
                f.layer,
                f.attribute or "",
                "" if f.value is None else str(f.value),
                "" if f.suggested is None else str(f.suggested),
                "" if f.cost_pct is None else f"{f.cost_pct:.2f}",
                f.message,
            ]
            for f in self
        ]
        if markdown:
            lines = ["| " + " | ".join(headers) + " |"]
            lines.append("|" + "|".join("---" for _ in headers) + "|")
            lines += ["| " + " | ".join(r) + " |" for r in rows]
            return "\n".join(lines)
        widths = [max(len(r[i]) for r in [headers] + rows) for i in range(7)]
        lines = []
        for r in [headers] + rows:
            cells = [c.ljust(w) for c, w in zip(r[:7], widths)]
            lines.append("  ".join(cells + [r[7]]).rstrip())
        return "\n".join(lines)


def pad_to_multiple(n: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `n`.

    Pads a dimension (vocabulary, units, batch) so that tensor cores can be
    used: the extra rows cost memory and compute in proportion
    (`(result - n) / n`), usually far less than the speed gained.

    Args:
        n: Int >= 1, the dimension.
        multiple: Int >= 1, the multiple to pad to.

    Returns:
        Int.

    Raises:
        TypeError: an argument is not an int.
        ValueError: an argument is < 1.

    Example:

    >>> pad_to_multiple(50257, 64)
    50304
    """
    check_int("n", n)
    check_int("multiple", multiple)
    return -(-n // multiple) * multiple


def walk_layers(model) -> list:
    """Every layer inside `model`, depth first, each once.

    Attention layers are leaves: their inner projections and softmax are
    Keras's business (see docs/mixed_precision.md).
    """
    seen, out = set(), []

    def visit(layer):
        for sub in sublayers(layer, recursive=False):
            if id(sub) in seen:
                continue
            seen.add(id(sub))
            out.append(sub)
            if not isinstance(sub, keras.layers.MultiHeadAttention):
                visit(sub)

    visit(model)
    return out
