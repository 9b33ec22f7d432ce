"""What a step will take, learnt from the steps this engine has run: the scheduler's clock for sizing steps.

A step's time on this host is close to linear in five features of its batch:
    t ~ b0 + b1 * rows + b2 * prefill_tokens + b3 * prefill_pairs + b4 * decode_context
- `rows`: decode rows (each request's next token and its drafted tokens): their share of the linears;
- `prefill_tokens`: prompt tokens computed in the step: the linears' work on them;
- `prefill_pairs`: sum over prefill chunks of tokens x the context each scores on average (start + half the
  chunk): a chunk's attention grows with how far into its prompt it is;
- `decode_context`: the tokens of context the decode rows read (their K/V), a long agent session's cost.
The figures depend on the CPU, the model and the speed the shared host runs at this minute, so they are fitted
here, not assumed: exponentially weighted least squares over the steps run (recent steps count most, so a host
that slows down or speeds up moves the fit within tens of steps), no coefficient below zero, with a small ridge
that keeps the fit defined before every feature has varied. Until it has seen enough prefill steps it answers nothing (`ready` is False)
and the scheduler sizes steps by tokens alone.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# the features' units, so the normal equations stay well conditioned: rows, 1k tokens, 1M token pairs, 10k tokens
_SCALE = (1.0, 1.0, 1e-3, 1e-6, 1e-4)
DECAY = 0.97  # each older step's weight: ~33 steps carry most of the fit
RIDGE = 1e-6
MIN_PREFILL_STEPS = 4  # prefill steps (at least MIN_PREFILL_TOKENS each) seen before the fit is used
MIN_PREFILL_TOKENS = 32


@dataclass(frozen=True)
class StepShape:
    """The features of one step's batch (module docstring)."""

    rows: int = 0
    prefill_tokens: int = 0
    prefill_pairs: float = 0.0
    decode_context: int = 0

    def features(self) -> tuple[float, ...]:
        raw = (1.0, float(self.rows), float(self.prefill_tokens), self.prefill_pairs, float(self.decode_context))
        return tuple(x * s for x, s in zip(raw, _SCALE))


def chunk_pairs(context: int, tokens: int) -> float:
    """Token pairs a prefill chunk of `tokens` starting after `context` computed tokens scores (about)."""
    return tokens * (context + tokens / 2)


class StepTimer:
    """The fitted step-time model (module docstring)."""

    def __init__(self) -> None:
        n = len(_SCALE)
        self._a = [[0.0] * n for _ in range(n)]  # weighted X^T X
        self._b = [0.0] * n  # weighted X^T y
        self._coef: list[float] | None = None
        self.prefill_steps = 0

    @property
    def ready(self) -> bool:
        return self._coef is not None and self.prefill_steps >= MIN_PREFILL_STEPS and self._coef[2] > 0

    def observe(self, shape: StepShape, seconds: float) -> None:
        """Fold one step's measured time into the fit."""
        x = shape.features()
        for i, xi in enumerate(x):
            row = self._a[i]
            for j, xj in enumerate(x):
                row[j] = DECAY * row[j] + xi * xj
            self._b[i] = DECAY * self._b[i] + xi * seconds
        if shape.prefill_tokens >= MIN_PREFILL_TOKENS:
            self.prefill_steps += 1
        self._coef = _nonnegative_fit(self._a, self._b)

    def set_coefficients(self, coef: Sequence[float]) -> None:
        """Fix the model (seconds per unit of each feature, unscaled): for tests and for a host measured elsewhere."""
        self._coef = [c / s for c, s in zip(coef, _SCALE)]
        self.prefill_steps = MIN_PREFILL_STEPS

    def predict(self, shape: StepShape) -> float:
        """Seconds the step is expected to take (0 before any step was seen)."""
        if self._coef is None:
            return 0.0
        return max(0.0, sum(c * x for c, x in zip(self._coef, shape.features())))

    def prefill_seconds(self, context: int, tokens: int) -> float:
        """The prefill part of a step: `tokens` prompt tokens after `context` computed ones."""
        if self._coef is None or tokens <= 0:
            return 0.0
        c = self._coef
        return max(0.0, c[2] * tokens * _SCALE[2] + max(0.0, c[3]) * chunk_pairs(context, tokens) * _SCALE[3])

    def prefill_tokens_within(self, seconds: float, context: int) -> int:
        """Most prompt tokens after `context` computed ones whose prefill fits in `seconds`."""
        if not self.ready or seconds <= 0:
            return 0
        assert self._coef is not None
        lin = self._coef[2] * _SCALE[2] + max(0.0, self._coef[3]) * context * _SCALE[3]
        quad = max(0.0, self._coef[3]) * _SCALE[3] / 2
        if quad <= 0:
            return int(seconds / lin)
        return int((-lin + (lin * lin + 4 * quad * seconds) ** 0.5) / (2 * quad))  # quad n^2 + lin n = seconds


def _nonnegative_fit(a: list[list[float]], b: list[float]) -> list[float] | None:
    """The ridge least-squares coefficients with none below zero: a feature whose coefficient comes out negative
    (rows and their contexts rise together, and a fit can trade one against the other) is dropped and the rest
    refitted, the most negative first. A step never costs less for more work."""
    active = list(range(len(b)))
    while active:
        sub = _solve([[a[i][j] + (RIDGE if i == j else 0.0) for j in active] for i in active], [b[i] for i in active])
        if sub is None:
            return None
        worst = min(range(len(active)), key=lambda k: sub[k])
        if sub[worst] >= 0:
            coef = [0.0] * len(b)
            for k, i in enumerate(active):
                coef[i] = sub[k]
            return coef
        del active[worst]
    return None


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """x with a x = b by Gaussian elimination with partial pivoting (a is tiny); None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[piv][col]) < 1e-300:
            return None
        m[col], m[piv] = m[piv], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            if f:
                for k in range(col, n + 1):
                    m[r][k] -= f * m[col][k]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][k] * x[k] for k in range(r + 1, n))) / m[r][r]
    return x
