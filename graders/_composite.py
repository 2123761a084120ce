"""Composite graders: Vertex's weighted mean and OpenAI's multi-grader formula.

Parts run concurrently and every part's Grade is kept in ``Grade.parts``. A part that could not
be graded makes the whole composite fail with the same state (``error`` over ``invalid``): a
missing part is never silently a 0 in the sum.

The formula is parsed with Python's ``ast`` and compiled into a tree of closures over a
whitelist of node types and functions: no ``eval``, no attribute access, no names other than
the part names.
"""

from __future__ import annotations

import ast
import asyncio
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._sample import Grade, Grader, Sample, aclose_grader, usage_of

MAX_PARTS = 16  # Vertex's console allows up to 16 rewards in a composite


class FormulaError(ValueError):
    """A formula uses something outside the whitelist, or names a grader that is not there."""


def _worst(parts: Mapping[str, Grade]) -> Grade | None:
    """The failure that decides a composite's state, naming the parts at fault."""
    for status in ("error", "invalid"):
        failed = {n: g for n, g in parts.items() if g.status == status}
        if failed:
            reasons = "; ".join(f"{n}: {g.error}" for n, g in failed.items())
            kinds = {g.error_kind for g in failed.values()}
            return Grade.failed(status, f"part(s) {', '.join(failed)} failed: {reasons}",  # type: ignore[arg-type]
                                error_kind=kinds.pop() if len(kinds) == 1 else "part_failed", parts=dict(parts), **usage_of(parts.values()))
    return None


class CompositeGrader:
    """Grades with every part concurrently, then combines the part scores.

    Built by :func:`weighted_grader` or :func:`formula_grader`; closing it closes its parts.
    """

    def __init__(self, parts: Mapping[str, Grader], combine: Callable[[dict[str, float]], float], describe: str, name: str) -> None:
        self.parts = dict(parts)
        self._combine = combine
        self.describe = describe
        self.__name__ = name

    async def __call__(self, sample: Sample) -> Grade:
        names = list(self.parts)
        grades = await asyncio.gather(*(self.parts[n](sample) for n in names))
        parts = dict(zip(names, grades))
        failed = _worst(parts)
        if failed is not None:
            return failed
        spent = usage_of(grades)  # the judge parts' requests and tokens are the composite's
        scores = {n: g.score for n, g in parts.items()}
        try:
            total = self._combine(scores)  # type: ignore[arg-type]
        except (ArithmeticError, ValueError) as e:  # 1/0, sqrt(-1), log(0), overflow
            return Grade.failed("invalid", f"{self.__name__}: {self.describe} cannot be computed: {e}", error_kind="formula", parts=parts,
                                **spent)
        if math.isnan(total):
            return Grade.failed("invalid", f"{self.__name__}: {self.describe} is not a number", error_kind="formula", parts=parts, **spent)
        debug = [f"{self.__name__}: {self.describe} = {total:g} with " + ", ".join(f"{n}={s:g}" for n, s in scores.items())]
        metrics = {f"{n}.score": s for n, s in scores.items() if s is not None}
        return Grade.scored(total, parts=parts, debug=debug, metrics=metrics, **spent)

    async def aclose(self) -> None:
        await asyncio.gather(*(aclose_grader(g) for g in self.parts.values()))


def _check_parts(parts: Mapping[str, Any], what: str) -> None:
    if not parts:
        raise ValueError(f"{what} needs at least one part")
    if len(parts) > MAX_PARTS:
        raise ValueError(f"{what} has {len(parts)} parts; at most {MAX_PARTS} are allowed")


def weighted_grader(parts: Mapping[str, tuple[Grader, float]] | Sequence[tuple[str, Grader, float]], *, name: str = "weighted") -> CompositeGrader:
    """Vertex's compositeRewardConfig: sum(w * r) / sum(w) over up to 16 named parts.

    Args:
        parts: ``{name: (grader, weight)}`` or ``[(name, grader, weight), ...]``; weights >= 0
            with a positive sum.
    """
    items = [(n, g, w) for n, (g, w) in parts.items()] if isinstance(parts, Mapping) else list(parts)
    names = [n for n, _, _ in items]
    duplicate = {n for n in names if names.count(n) > 1}
    if duplicate:
        raise ValueError(f"{name}: part names must be unique; repeated: {', '.join(sorted(duplicate))}")
    weights = {n: float(w) for n, _, w in items}
    _check_parts(weights, name)
    negative = [n for n, w in weights.items() if w < 0 or math.isnan(w)]
    if negative:
        raise ValueError(f"{name}: weights must be >= 0; part(s) {', '.join(negative)} are not")
    total = sum(weights.values())
    if total <= 0:
        raise ValueError(f"{name}: the weights sum to 0")

    def combine(scores: dict[str, float]) -> float:
        return sum(weights[n] * scores[n] for n in weights) / total

    describe = "(" + " + ".join(f"{w:g}*{n}" for n, w in weights.items()) + f") / {total:g}"
    return CompositeGrader({n: g for n, g, _ in items}, combine, describe, name)


# ---- the formula ----------------------------------------------------------------------------

_FUNCTIONS: dict[str, tuple[Callable[..., float], int, int | None]] = {
    # name: (function, min args, max args or None for any)
    "min": (lambda *a: min(a), 1, None),
    "max": (lambda *a: max(a), 1, None),
    "abs": (abs, 1, 1),
    "floor": (lambda x: float(math.floor(x)), 1, 1),
    "ceil": (lambda x: float(math.ceil(x)), 1, 1),
    "exp": (math.exp, 1, 1),
    "sqrt": (math.sqrt, 1, 1),
    "log": (math.log, 1, 2),
}
_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: math.pow(a, b),  # floats only: raises OverflowError instead of building a huge int
}
_UNARY: dict[type, Callable[[float], float]] = {ast.USub: lambda a: -a, ast.UAdd: lambda a: a}
MAX_FORMULA_LENGTH = 2000

Node = Callable[[Mapping[str, float]], float]


def compile_formula(formula: str, names: Sequence[str]) -> Node:
    """Compile ``formula`` over the given variable names into a function of their values.

    Operators ``+ - * / ^`` (``**`` too) and parentheses; functions min max abs floor ceil exp
    sqrt log; numbers; the names. ``^`` is power, as in OpenAI's multi grader.
    """
    if len(formula) > MAX_FORMULA_LENGTH:
        raise FormulaError(f"formula is {len(formula)} characters long; the limit is {MAX_FORMULA_LENGTH}")
    # Python's ^ is XOR and binds looser than +; as ** it gets power's precedence and associativity.
    source = formula.replace("^", "**").strip()
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as e:
        raise FormulaError(f"formula {formula!r} is not a valid expression: {e.msg} at column {e.offset}") from None
    except (RecursionError, MemoryError):
        raise FormulaError(f"formula {formula[:80]!r}... is nested too deeply") from None
    known = set(names)
    return _node(tree.body, formula, known)


def formula_text(formula: str, *, variable: Callable[[str], str], binary: Callable[[type, str, str], str],
                 negate: Callable[[str], str], call: Callable[[str, list[str]], str]) -> str:
    """A checked formula (:func:`compile_formula`) written out in another syntax, OpenAI's calculate_output or a
    standalone file's Python: one walk of the tree, the target saying how it writes a grader's name, an operator
    (``ast.Add`` ... ``ast.Pow``) over two written operands, a negation and a function call."""
    tree = ast.parse(formula.replace("^", "**").strip(), mode="eval")

    def emit(node: ast.AST) -> str:
        if isinstance(node, ast.Constant):
            return repr(float(node.value))
        if isinstance(node, ast.Name):
            return variable(node.id)
        if isinstance(node, ast.BinOp):
            return binary(type(node.op), emit(node.left), emit(node.right))
        if isinstance(node, ast.UnaryOp):
            return negate(emit(node.operand)) if isinstance(node.op, ast.USub) else emit(node.operand)
        if isinstance(node, ast.Call):
            assert isinstance(node.func, ast.Name)
            return call(node.func.id, [emit(a) for a in node.args])
        raise AssertionError(ast.dump(node))

    return emit(tree.body)


def _node(node: ast.AST, formula: str, known: set[str]) -> Node:
    where = f"formula {formula!r}"
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise FormulaError(f"{where}: only numbers are allowed as constants, not {node.value!r}")
        value = float(node.value)
        return lambda env: value
    if isinstance(node, ast.Name):
        if node.id not in known:
            offered = ", ".join(sorted(known)) or "(none)"
            raise FormulaError(f"{where}: unknown name {node.id!r}; the graders are: {offered}")
        ident = node.id
        return lambda env: env[ident]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        op, left, right = _BINARY[type(node.op)], _node(node.left, formula, known), _node(node.right, formula, known)
        return lambda env: op(left(env), right(env))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        uop, operand = _UNARY[type(node.op)], _node(node.operand, formula, known)
        return lambda env: uop(operand(env))
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
            called = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
            raise FormulaError(f"{where}: function {called!r} is not allowed; use {', '.join(_FUNCTIONS)}")
        if node.keywords:
            raise FormulaError(f"{where}: {node.func.id}() takes no keyword arguments")
        fn, least, most = _FUNCTIONS[node.func.id]
        count = len(node.args)
        if count < least or (most is not None and count > most):
            expected = f"{least}" if least == most else f"{least} or more" if most is None else f"{least} to {most}"
            raise FormulaError(f"{where}: {node.func.id}() takes {expected} argument(s), got {count}")
        args = [_node(a, formula, known) for a in node.args]
        return lambda env: float(fn(*(a(env) for a in args)))
    raise FormulaError(f"{where}: {type(node).__name__} ({ast.unparse(node)!r}) is not allowed; "
                       "use numbers, grader names, + - * / ^, parentheses and min max abs floor ceil exp sqrt log")


def formula_grader(parts: Mapping[str, Grader], formula: str, *, name: str = "formula") -> CompositeGrader:
    """OpenAI's multi grader: run the named graders, then evaluate ``formula`` over their scores.

    Example: ``formula_grader({"exact": g1, "tone": g2}, "0.7 * exact + 0.3 * max(tone, 0)")``.
    Division by zero or a math domain error makes the grade invalid, never a number.
    """
    _check_parts(parts, name)
    bad = [n for n in parts if not n.isidentifier()]
    if bad:
        raise FormulaError(f"{name}: grader names used in a formula must be identifiers; rename {', '.join(bad)}")
    compiled = compile_formula(formula, list(parts))
    return CompositeGrader(parts, compiled, formula.strip(), name)
