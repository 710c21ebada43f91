"""A safe arithmetic calculator: the one tool of the calc agent.

The expression is parsed with :mod:`ast` and only a small whitelist of nodes is evaluated; nothing is ever passed to
``eval``. Names, attribute access, calls, subscripts, comprehensions, strings and every other node are rejected.

Accepted syntax:
    * numbers: integers and decimals (``12``, ``0.5``, ``1e3``), thousands separators are *not* accepted
      (``1,000`` is rejected with a hint, because Python would read it as a tuple);
    * binary ``+ - * / // % **``, unary ``+ -`` and parentheses;
    * ``^`` means power (``2^10 == 1024``): in the arithmetic the model reads and writes, ``^`` is always a power,
      never a bitwise XOR, so it is rewritten to ``**`` before parsing;
    * the typographic signs ``×``, ``÷`` and ``−`` (U+2212), and one trailing ``=`` (``"4 + 3 ="`` as the questions
      of reasoning-gym ``chain_sum`` write it) are accepted too.

Limits (each violation gives an ``Error: ...`` string, never an exception from :func:`calculate`):
    * ``MAX_EXPRESSION_CHARS`` characters per expression;
    * ``|exponent| <= MAX_EXPONENT`` for ``**``;
    * ``|value| <= MAX_ABS_VALUE`` for every intermediate and the final value.

Results are canonical strings (see :func:`format_number`): integers without ``.0``, other values rounded to
``SIGNIFICANT_DIGITS`` significant digits in positional notation without trailing zeros.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable

MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 100
MAX_ABS_VALUE = 1e30
SIGNIFICANT_DIGITS = 10
ERROR_PREFIX = "Error: "

Number = int | float

_BINARY_OPS: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_TRANSLATION = str.maketrans({"×": "*", "÷": "/", "−": "-", "^": "**"})


class CalculatorError(ValueError):
    """The expression is invalid or outside the calculator's limits; the message says why, for the model."""


def calculate(expression: str) -> str:
    """Evaluate ``expression`` and return the canonical result string, or ``"Error: <reason>"``.

    This is the tool the model calls. It never raises for bad input: every problem becomes an error string that is
    sent back to the model as the tool result.

    Example:
        >>> calculate("(2 + 3) * 4 / 8")
        '2.5'
        >>> calculate("__import__('os')")
        'Error: names are not allowed (found "__import__"); use numbers only'
    """
    try:
        return format_number(evaluate(expression))
    except CalculatorError as exc:
        return f"{ERROR_PREFIX}{exc}"


def is_error(result: str) -> bool:
    """True when ``result`` (a :func:`calculate` output) is an error string."""
    return result.startswith(ERROR_PREFIX)


def evaluate(expression: str) -> Number:
    """Evaluate ``expression`` to an ``int`` or a finite ``float``.

    Integer arithmetic stays exact; ``/`` gives an ``int`` when the division is exact and a ``float`` otherwise.

    Raises:
        CalculatorError: the expression is empty, too long, not arithmetic, divides by zero, or exceeds a limit.
    """
    if not isinstance(expression, str):
        raise CalculatorError(f"the expression must be a string, got {type(expression).__name__}")
    text = expression.strip().translate(_TRANSLATION)
    if text.endswith("="):
        text = text[:-1].rstrip()
    if not text:
        raise CalculatorError("empty expression")
    if len(text) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression too long ({len(text)} characters, at most {MAX_EXPRESSION_CHARS})")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"invalid syntax in {expression.strip()!r}; use numbers, + - * / ** and ()") from exc
    except (ValueError, RecursionError, MemoryError) as exc:  # e.g. null bytes, absurd nesting
        raise CalculatorError("invalid expression") from exc
    try:
        return _eval(tree.body)
    except RecursionError as exc:
        raise CalculatorError("expression nested too deeply") from exc


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise CalculatorError(f"only numbers are allowed, found {value!r}")
        return _check(value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        operand = _eval(node.operand)
        return operand if isinstance(node.op, ast.UAdd) else -operand
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left), _eval(node.right)
        return _check(_binary(node.op, left, right))
    if isinstance(node, ast.Name):
        raise CalculatorError(f'names are not allowed (found "{node.id}"); use numbers only')
    if isinstance(node, ast.Tuple):
        raise CalculatorError("commas are not allowed; write 1000, not 1,000, and one expression per call")
    if isinstance(node, ast.Call | ast.Attribute | ast.Subscript):
        raise CalculatorError("functions, attributes and indexing are not allowed; use numbers, + - * / ** and ()")
    raise CalculatorError(f"unsupported syntax ({type(node).__name__}); use numbers, + - * / ** and ()")


def _binary(op: ast.operator, left: Number, right: Number) -> Number:
    if isinstance(op, ast.Div):
        if right == 0:
            raise CalculatorError("division by zero")
        if isinstance(left, int) and isinstance(right, int) and left % right == 0:
            return left // right
        return left / right
    if isinstance(op, ast.Pow):
        return _power(left, right)
    func = _BINARY_OPS.get(type(op))
    if func is None:
        raise CalculatorError(f"operator {type(op).__name__} is not supported; use + - * / // % ** and ()")
    if isinstance(op, ast.FloorDiv | ast.Mod) and right == 0:
        raise CalculatorError("division by zero")
    return func(left, right)


def _power(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise CalculatorError(f"exponent too large ({format_number(exponent)}, at most {MAX_EXPONENT})")
    if base == 0 and exponent < 0:
        raise CalculatorError("division by zero (0 to a negative power)")
    if abs(base) > 1 and exponent > 0 and exponent * math.log10(abs(base)) > math.log10(MAX_ABS_VALUE):
        raise CalculatorError(f"result too large (more than {MAX_ABS_VALUE:.0e})")
    try:
        result = base**exponent
    except OverflowError as exc:
        raise CalculatorError("result too large") from exc
    if isinstance(result, complex):
        raise CalculatorError("result is not a real number (negative base with a fractional exponent)")
    return result


def _check(value: Number) -> Number:
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("result is not a finite number")
    if abs(value) > MAX_ABS_VALUE:
        raise CalculatorError(f"result too large (more than {MAX_ABS_VALUE:.0e})")
    return value


def format_number(value: Number) -> str:
    """Canonical text of a number: ``7``, ``-2``, ``2.5``, ``0.3333333333``.

    Integers (and integral floats) print without ``.0``; other floats are rounded to ``SIGNIFICANT_DIGITS``
    significant digits, written without an exponent and without trailing zeros. ``-0`` prints as ``0``.
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise CalculatorError("result is not a finite number")
        if value.is_integer():
            value = int(value)
        else:
            magnitude = math.floor(math.log10(abs(value)))
            decimals = min(max(SIGNIFICANT_DIGITS - 1 - magnitude, 0), 30)
            text = f"{value:.{decimals}f}"
            if "." in text:
                text = text.rstrip("0").rstrip(".")
            return "0" if text in ("-0", "") else text
    return str(int(value))
