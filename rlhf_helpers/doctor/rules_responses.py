"""The run doctor's rules on what the policy writes: onto a few replies (`collapse`: its entropy or
the batch's distinct responses fall), towards 0 tokens (`length_collapse`), or to max_new_tokens
without an EOS (`length_runaway`).

Each rule reads the rows (`rows.Rows`: one per step, every value a float or None) and returns one
Finding or None; a rule whose metrics the history lacks stays silent.
"""

from __future__ import annotations

from rlhf_helpers.doctor.facts import RunFacts
from rlhf_helpers.doctor.findings import Finding
from rlhf_helpers.doctor.registry import finding, rule
from rlhf_helpers.doctor.rows import (
    GLOSSARY_PAGE,
    LAB,
    Rows,
    fmt,
    logged,
    metric,
    passing,
    sustained,
)
from rlhf_helpers.doctor.thresholds import Thresholds


@rule("collapse", "warning", reads=("entropy", "distinct_responses"),
      fires=lambda t: f"entropy below {t.entropy_drop:g} x its step-1 value, or "
                      f"distinct_responses < {t.distinct_floor:g}, at {t.sustain_steps} steps",
      teaches=f"{GLOSSARY_PAGE}#entropy and {LAB}, 'Your turn'")
def collapse(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    start = next((v for row in rows if (v := metric(row, "entropy")) is not None), None)
    low = passing(rows, "entropy", lambda v: start is not None and v < t.entropy_drop * start)
    same = passing(rows, "distinct_responses", lambda v: v < t.distinct_floor)
    if not (sustained(low, logged(rows, "entropy"), t)
            or sustained(same, logged(rows, "distinct_responses"), t)):
        return None
    dropped = f" (below {t.entropy_drop:g} x step 1's {start:.4g})" if low else ""
    parts = [part for part in (
        fmt(low, "entropy") + dropped,
        fmt(same, "distinct_responses") + (f" (below {t.distinct_floor:g})" if same else ""))
             if part]
    return finding("collapse", sorted({s for s, _ in low} | {s for s, _ in same}), "; ".join(parts),
                   title="the policy collapses onto a few responses",
                   meaning="mode collapse: every prompt gets (nearly) the same reply, often one "
                           "the reward model overrates",
                   check_first="the learning rate (lower it), kl_coef (raise it), entropy_coef, "
                               "and a few samples by eye")


@rule("length_collapse", "warning", reads=("response_length",),
      fires=lambda t: f"response_length <= {t.short_length:g} tokens at {t.sustain_steps} steps",
      teaches=f"{GLOSSARY_PAGE}#response_length and {LAB}, 'Your turn'")
def length_collapse(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    short = passing(rows, "response_length", lambda v: v <= t.short_length)
    if not sustained(short, logged(rows, "response_length"), t):
        return None
    return finding("length_collapse", [s for s, _ in short], fmt(short, "response_length"),
                   title="responses collapse towards 0 tokens",
                   meaning="a shorter response returns more: the KL penalty is paid per token, so "
                           "a policy far from the reference (after too large an update) pays less "
                           "the sooner it stops; or the reward model scores short or empty "
                           "responses well. A negative score alone is no reason: with gamma = 1 "
                           "every response is paid its score once, whatever its length",
                   check_first="kl_coef x kl against the score (a KL penalty that outweighs it), "
                               "the learning rate, and the reward of an empty response")


@rule("length_runaway", "warning", reads=("eos_fraction", "response_length"),
      fires=lambda t: f"eos_fraction < {t.eos_floor:g} with response_length >= "
                      f"{t.long_share:.0%} of max_new_tokens at {t.sustain_steps} steps",
      teaches=f"{LAB}, section (b)")
def length_runaway(rows: Rows, facts: RunFacts, t: Thresholds) -> Finding | None:
    # one length warning a run: when the responses collapse, that is the one named
    if not facts.max_new_tokens or length_collapse(rows, facts, t) is not None:
        return None
    at_limit = [(int(r["step"]), e) for r in rows
                if (e := metric(r, "eos_fraction")) is not None and e < t.eos_floor
                and (metric(r, "response_length") or 0) >= t.long_share * facts.max_new_tokens]
    if not sustained(at_limit, logged(rows, "eos_fraction"), t):
        return None
    return finding("length_runaway", [s for s, _ in at_limit], fmt(at_limit, "eos_fraction")
                   + f" with the mean length >= {t.long_share:.0%} of max_new_tokens "
                     f"{facts.max_new_tokens}",
                   title="responses run to max_new_tokens without an EOS",
                   meaning="length hacking (the reward pays for length), or the EOS token never "
                           "trained (pad equal to EOS masks it out)",
                   check_first="pad_token_id != eos_token_id, that the response mask keeps the "
                               "first EOS, and missing_eos_penalty")
