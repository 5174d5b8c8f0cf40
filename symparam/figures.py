"""Exact number formatting from integers and fractions, never through floats: decimals and counts in B, M, K."""

from __future__ import annotations

from fractions import Fraction


def decimal(x: Fraction | int, places: int = 2) -> str:
    """An exact number rounded half away from zero to `places` decimals, e.g. "8.19" (the documents' B and %)."""
    scaled = Fraction(x) * 10**places
    whole = int(scaled + Fraction(1, 2)) if scaled >= 0 else -int(-scaled + Fraction(1, 2))
    sign = "-" if whole < 0 else ""
    q, r = divmod(abs(whole), 10**places)
    return f"{sign}{q:,}.{r:0{places}d}" if places else f"{sign}{q:,}"


def scaled(n: int) -> str:
    """A count in B (10^9), M or K with two exact decimals: 1,342,177,280,004,591,051.60 B at any size."""
    scale, unit = next((s, u) for s, u in ((10**9, "B"), (10**6, "M"), (10**3, "K"), (1, "")) if abs(n) >= s or s == 1)
    return f"{decimal(Fraction(n, scale))} {unit}".rstrip()


def percent(part: int, whole: int) -> str:
    """part/whole in percent, two exact decimals."""
    return decimal(Fraction(100 * part, whole))


__all__ = ["decimal", "percent", "scaled"]
