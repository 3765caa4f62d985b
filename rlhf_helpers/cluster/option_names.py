"""The course's registered option values (a KL estimator) by the names verl and OpenRLHF give them.

    option_name(config, "kl_kind", "verl")      # "low_var_kl" for kl_kind="k3"
    unnamed_options(config, {"openrlhf"})       # ["kl_kind=...: OpenRLHF has no KL estimator ..."]

A field of `PPOConfig.OPTIONS` takes names from a registry (`core.registry`) whose entries carry
each framework's own name for the value (`entry.verl`, `entry.openrlhf`; None where it has none).
The export reads those, so a value registered with its names is exported with no change here, and
one that a framework lacks is named among the "not carried over" lines.
"""

from __future__ import annotations

from rlhf_helpers.runtime.ppo_config import PPOConfig

#: For each OPTIONS field, the value whose name the export sends where a framework has no name for
#: the run's: what both frameworks do without the setting (verl's kl_penalty and OpenRLHF's
#: --algo.kl.estimator both default to k1).
OPTION_FALLBACKS: dict[str, str] = {"kl_kind": "k1"}
#: How the lines name each framework (`knobs.FRAMEWORKS`).
SPELLED = {"verl": "verl", "openrlhf": "OpenRLHF"}


def option_name(config: PPOConfig, field: str, framework: str) -> str:
    """The name `framework` ("verl", "openrlhf") has for the config's value of `field` (a field of
    PPOConfig.OPTIONS); where it has none, its name for `OPTION_FALLBACKS[field]`."""
    registry = PPOConfig.OPTIONS[field]
    name = getattr(registry[getattr(config, field)], framework)
    return name if name is not None else getattr(registry[OPTION_FALLBACKS[field]], framework)


def unnamed_options(config: PPOConfig, frameworks: set[str]) -> list[str]:
    """One "not carried over" line for each OPTIONS field whose value none of `frameworks` has a
    name for."""
    lines = []
    for field, registry in PPOConfig.OPTIONS.items():
        value = getattr(config, field)
        if all(getattr(registry[value], framework) is None for framework in frameworks):
            names = sorted(SPELLED[framework] for framework in frameworks)
            lines.append(
                f"{field}={value}: {' and '.join(names)} {'has' if len(names) == 1 else 'have'} "
                f"no {registry.what} {value!r} ({registry.home}): the export sends "
                f"{OPTION_FALLBACKS[field]}, what {'it does' if len(names) == 1 else 'they do'} "
                "without the setting")
    return lines
