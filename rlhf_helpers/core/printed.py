"""Numbers and lines as the course prints them: a value that rounds to zero prints without a minus
sign, and no printed line is longer than PRINT_WIDTH.

Python keeps the sign of a negative number that rounds to zero, and of IEEE's negative zero (what
`-0.6 * 0` gives): `f"{-0.001:.2f}"` is "-0.00" and `f"{-0.0:+.2f}"` is "-0.00", which a reader
takes for a small negative value. `format_number` writes "0.00" (or "+0.00"); `cell_formatter` does
the same for every number of a pandas table (`frame.style.format(cell_formatter(".2f"))`). Neither
changes a value, only how it is printed.

JupyterLab breaks an output line that is wider than its output area at any character (its CSS for
output text: `word-break: break-all`), so a long line reads "ppo_" at the end of one line and
"update" at the start of the next; at 1400 px with the file browser open the area holds about 120
characters. `wrap_printed` wraps a line longer than PRINT_WIDTH at its spaces instead.
"""

from __future__ import annotations

import math
import numbers
import textwrap
from collections.abc import Callable
from typing import SupportsFloat

_NONZERO_DIGITS = frozenset("123456789")
#: the longest line `wrap_printed` leaves as it is
PRINT_WIDTH = 100


def format_number(value: SupportsFloat, spec: str = ".2f") -> str:
    """`format(value, spec)`, without the minus sign of a negative value that prints as zero
    ("-0.00" -> "0.00", with "+" in `spec`: "+0.00"). `value`: a real number (a Python or numpy
    number, a 0-d tensor); `spec`: a format spec such as ".2f", "+.3f", ".1%" or ".3g". Raises
    ValueError for a value that is not a number."""
    if isinstance(value, numbers.Integral):
        return format(value, spec)  # an integer has no negative zero
    try:
        number = float(value)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"value must be a real number, got {type(value).__name__}: {value!r}") from error
    text = format(number, spec)
    # only a negative value printed with all digits 0 changes: "-0.00", "-0", "-0.0%", "-0.00e+00"
    mantissa = text.lower().partition("e")[0]
    all_zero = any(c.isdigit() for c in mantissa) and not _NONZERO_DIGITS & set(mantissa)
    if math.copysign(1.0, number) < 0 and all_zero:
        return format(-number, spec)
    return text


def cell_formatter(spec: str = ".2f") -> Callable[[object], str]:
    """A formatter for pandas' `Styler.format` that prints every non-integer number with
    `format_number(value, spec)` and anything else (text, an integer, a missing value) as `str`
    does, as `format(precision=...)` would."""

    def cell(value: object) -> str:
        fractional = isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral)
        if fractional and not math.isnan(value):
            return format_number(value, spec)
        return str(value)

    return cell


def wrap_printed(text: str, width: int = PRINT_WIDTH, indent: str = "  ") -> str:
    """`text` with every line longer than `width` wrapped at its spaces: each continuation line
    starts with the line's own indentation plus `indent`. A word longer than a line (a path) stays
    whole, and a shorter line stays exactly as it is. Raises ValueError for a `width` under 20."""
    if width < 20:
        raise ValueError(f"width must be at least 20 characters, got {width}")
    lines = []
    for line in text.split("\n"):
        if len(line) <= width:
            lines.append(line)
            continue
        lead = line[: len(line) - len(line.lstrip(" "))]
        lines.append(textwrap.fill(line[len(lead) :], width, initial_indent=lead,
                                   subsequent_indent=lead + indent,
                                   break_long_words=False, break_on_hyphens=False))
    return "\n".join(lines)
