"""The source documents' worked examples, recomputed exactly: what each document states beside what the code computes."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import sympy as sp

from symparam.model import Model, load
from symparam.symbols import N, V, d, d_ff, d_moe, evaluate, h, h_d, h_kv, k, n

GI, MI = 2**30, 2**20  # several documents sum in binary units and print "G" or "M"


@dataclass(frozen=True)
class Claim:
    """A figure a document states, and the exact figure for the same quantity."""

    what: str  # the quantity
    stated: str  # as the document prints it
    stated_value: int | Fraction  # that figure as a number (binary units expanded where the document used them)
    exact: int  # computed by the engine
    why: str = ""  # the erratum, when the two differ

    @property
    def status(self) -> str:
        """"exact"; "rounded" for an abbreviated figure (ending in M, G or B) within 0.5 %; else "differs"."""
        if self.stated_value == self.exact:
            return "exact"
        close = abs(Fraction(self.stated_value) - self.exact) / self.exact < Fraction(1, 200)
        return "rounded" if close and self.stated.rstrip()[-1:] in ("M", "G", "B") else "differs"


@dataclass(frozen=True)
class Example:
    """One worked example of a source document."""

    title: str
    source: str  # seed file
    preset: str
    claims: tuple[Claim, ...]


def at(model: Model, expr: sp.Expr, **overrides: int) -> int:
    """An expression at a preset's values, some of them replaced (to redo a document's own arithmetic); exact."""
    values = {**{str(s): v for s, v in model.substitution().items()}, **overrides}
    return evaluate(expr, values, f"{model.name}: {expr}")


def part(model: Model, component: str, active: bool = False) -> int:
    count = model.count()
    return (count.active_components if active else count.components)[component]


def classic() -> list[Example]:
    out = []
    for preset, total in (("classic-512", 57_987_072), ("classic-512-tied", 41_603_072)):
        m = load(preset)
        claims = [Claim("total", f"{total:,}", total, m.count().total)]
        if preset == "classic-512":
            claims += [
                Claim("embedding", "16,384,000", 16_384_000, part(m, "input embedding")),
                Claim("attention (8 layers)", "8,404,992", 8_404_992, part(m, "attention")),
                Claim("FFN (8 layers)", "16,797,696", 16_797_696, part(m, "dense FFN")),
                Claim("layer norms (8 layers)", "16,384", 16_384, part(m, "norms")),
            ]
        tying = "tied head (the document's scheme 2)" if preset.endswith("tied") else "untied head (scheme 1)"
        out.append(Example(f"Classic 512-d transformer, {tying}", "000", preset, tuple(claims)))
    return out


def mistral() -> Example:
    m = load("mistral-7b")
    estimate = at(m, 2 * V * d + N * (4 * d**2 + 3 * d * d_ff))
    gqa = at(m, N * d**2 * (2 + 2 * h_kv / h))
    mha = at(m, 4 * N * d**2)
    claims = (
        Claim("estimate 2Vd + N(4d^2 + 3Md^2), M = 3.5", "7.5B", Fraction(15, 2) * GI // 1, estimate,
              f"the sum is done in units of 2^30: it is {estimate:,} = 8.05 B (10^9), as the document's own footnote (8.053B) says; the real count is {m.count().total:,}"),
        Claim("attention, 32 layers, GQA d^2(2 + 2/g)", "1.25G", Fraction(5, 4) * GI, gqa,
              "\"1.25G\" is 1.25 x 2^30; in 10^9 it is 1.34 B"),
        Claim("attention, 32 layers, without GQA (4d^2)", "2G", 2 * GI, mha, "\"2G\" is 2 x 2^30; in 10^9 it is 2.15 B"),
        Claim("attention of the real model (no biases)", "1.25G", Fraction(5, 4) * GI, part(m, "attention")),
        Claim("total", "7.2B", 7_200_000_000, m.count().total, "the exact count is 7.24 B; 7.2B truncates it"),
    )
    return Example("Mistral-7B", "001", "mistral-7b", claims)


def qwen25_3b() -> Example:
    m = load("qwen2.5-3b")
    g = m.values["h"] // m.values["h_kv"]
    attention_doc = at(m, N * d**2 * 3)  # the written 2 + 2/2
    attention_g = at(m, N * d**2 * (2 + 2 * h_kv / h))
    ffn = at(m, 3 * N * d * d_ff)
    embedding = at(m, V * d)
    doc_sum = attention_g + ffn + 2 * embedding
    claims = (
        Claim("embedding V d", "311,205,888", 311_205_888, embedding, f"151936 x 2048 = {embedding:,}"),
        Claim("attention N d^2(2 + 2/g)", "36 x 2048^2 x (2 + 2/2) = 324M", 324 * MI, attention_g,
              f"g = h / h_kv = 16 / 2 = {g}, not 2 (2 is h_kv); with g = 2 the formula gives {attention_doc:,}. "
              f"The printed 324M is the g = {g} value in units of 2^20: {attention_g:,}"),
        Claim("FFN 3 N d d_ff", "2322M", 2322 * MI, ffn, f"in units of 2^20; in 10^9 it is {ffn:,}"),
        Claim("total", "3.16G", Fraction(316, 100) * GI, m.count().total,
              f"the document adds the LM head as a second {embedding:,}, but Qwen2.5-3B ties it to the embedding "
              f"(stored once); it also leaves out q/k/v biases and norms. Its own sum is {doc_sum:,} = 3.40 B (10^9); exact {m.count().total:,}"),
    )
    return Example("Qwen2.5-3B", "001", "qwen2.5-3b", claims)


def qwen3_8b() -> Example:
    m = load("qwen3-8b")
    c = m.count()
    v = m.values
    claims = (
        Claim("total", "7,722,242,048 (theory) / 7,721,988,096 (measured)", 7_722_242_048, c.total,
              f"the real Qwen3-8B has N = {v['N']} layers (not 32), h_kv = {v['h_kv']} (GQA, not MHA with 32) and d_ff = {v['d_ff']:,}"),
        Claim("word embedding V d", "622,854,144", 622_854_144, part(m, "input embedding"), f"V = {v['V']:,}: V d = {c.components['input embedding']:,}"),
        Claim("self-attention per layer", "67.12M (MHA, 4d^2)", at(m, 4 * d**2), at(m, 2 * d * h * h_d + 2 * d * h_kv * h_d + 2 * h_d),
              f"with h_kv = {v['h_kv']}: 2 d h h_d + 2 d h_kv h_d + 2 h_d"),
        Claim("MLP per layer", "135.27M", at(m, 3 * d * d_ff, d_ff=11008), at(m, 3 * d * d_ff), f"3 d d_ff with d_ff = {v['d_ff']:,}, not 11,008"),
    )
    return Example("Qwen3-8B", "002", "qwen3-8b", claims)


def qwen3_dense() -> Example:
    m = load("qwen3-32b")
    formula = N * (2 * d + 3 * d * d_ff + 2 * h * h_d * d + 2 * h_kv * h_d * d + 2 * h_d) + d * (2 * V + 1)
    claims = (Claim("total, N(2d + 3dd_ff + 2hh_d d + 2h_kv h_d d + 2h_d) + d(2V + 1)", "32.762123264 x 10^9", 32_762_123_264, at(m, formula)),
              Claim("total of the engine", "32,762,123,264", 32_762_123_264, m.count().total))
    return Example("Qwen3-32B", "003", "qwen3-32b", claims)


def qwen3_moe() -> Example:
    m = load("qwen3-235b-a22b")
    c = m.count()
    printed_total = N * (2 * d + n * d + 3 * n * d * d_moe + h * h_d * d + 2 * h_kv * h_d * d + d * h * h_d + 2 * d) + d * (2 * V + 1)
    printed_active = N * (2 * d + n * d + 3 * k * d * d_moe + 2 * h_kv * h_d * d + d * h * h_d + 2 * h_d) + d * (2 * V + 1)
    k_rows = c.active - at(m, N * (n - k) * d)
    claims = (
        Claim("total (stated figure)", "235.09363456 x 10^9", 235_093_634_560, c.total),
        Claim("total by the printed formula", "235.09363456 x 10^9", 235_093_634_560, at(m, printed_total),
              "the printed total formula ends in + 2d where the q/k norms give + 2h_d; the stated figure is right, the formula is not"),
        Claim("active (stated figure)", "22.14456064 x 10^9", 22_144_560_640, c.active,
              f"the stated figure counts only k of the n router rows (exact active minus N(n - k)d = {k_rows:,}); "
              "every token uses the whole router, so all n rows are active"),
        Claim("active by the printed formula", "22.14456064 x 10^9", 22_144_560_640, at(m, printed_active),
              f"the printed active formula drops W_Q (h h_d d per layer): it gives {at(m, printed_active):,}"),
    )
    return Example("Qwen3-235B-A22B", "003", "qwen3-235b-a22b", claims)


def gpt2() -> list[Example]:
    out = []
    doc = V * d + N * (3 * d**2 + d**2 + 2 * d * d_ff)
    for preset in ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"):
        m = load(preset)
        c = m.count()
        claims = [Claim("the document's formula V d + N(4d^2 + 2 d d_ff) at V = 50257", "-", at(m, doc), c.total,
                        f"leaves out the position table P d = {c.components['position embedding']:,}, biases and LayerNorms")]
        if preset == "gpt2":
            claims.insert(0, Claim("total, 50000 x 768 + (768 x 768 x 3 + 768 x 768 + 768 x 3072 x 2) x 12", "124M", at(m, doc, V=50000), c.total,
                                   f"the sum is {at(m, doc, V=50000):,} = 123.3M, not 124M; GPT-2's vocabulary is 50,257, not 50,000, and positions, biases and norms add the rest: exact {c.total:,}"))
            claims.insert(1, Claim("embedding 50000 x 768", "38.4M", 38_400_000, c.components["input embedding"], "V = 50,257"))
        out.append(Example(f"GPT-2 ({preset})", "004", preset, tuple(claims)))
    return out


def examples() -> list[Example]:
    """Every worked example of the source documents, in document order."""
    return [*classic(), mistral(), qwen25_3b(), qwen3_8b(), qwen3_dense(), qwen3_moe(), *gpt2()]


__all__ = ["Claim", "Example", "examples"]
