"""The option names are the same in core, config, export and widgets: each registry
(`core.kl_estimators`, `core.advantage_estimators`, `ppo.piece_contracts`) is the one list of its
names, and a value registered there reaches every reader with no other file changed.

Before, the KL estimators' names lived in core/kl.py and again, by hand, in runtime/ppo_config.py
(which may not import torch), the cluster export kept its own verl map, and the explorers drew
whatever core accepted (three curves assumed): a fourth estimator broke the config, the export and
the KL explorer.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
import torch
from registry_entries import registered, test_estimator

from rlhf_helpers.cluster import export
from rlhf_helpers.cluster.knobs import FRAMEWORKS, KNOBS
from rlhf_helpers.cluster.option_names import OPTION_FALLBACKS
from rlhf_helpers.core.advantage_estimators import (
    ADVANTAGE_ESTIMATORS,
    ADVANTAGE_FUNCTIONS,
    advantage_estimator,
)
from rlhf_helpers.core.gae import compute_gae
from rlhf_helpers.core.group_advantages import grpo_advantages, rloo_advantages
from rlhf_helpers.core.kl import KL_KINDS, kl_estimate, shape_rewards
from rlhf_helpers.core.kl_estimators import KL_ESTIMATORS, drawn_kl_kinds
from rlhf_helpers.ppo import pieces
from rlhf_helpers.ppo.piece_contracts import PIECES
from rlhf_helpers.ppo.trainer import PPOTrainer
from rlhf_helpers.runtime.config_fields import add_field_flags, given_field_values
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import gpu_profile

#: the registries and every module that validates or exports their names: none may import torch
TORCH_FREE = ("rlhf_helpers.core.registry", "rlhf_helpers.core.kl_estimators",
              "rlhf_helpers.core.advantage_estimators", "rlhf_helpers.runtime.ppo_config",
              "rlhf_helpers.runtime.config_fields", "rlhf_helpers.cluster.export",
              "rlhf_helpers.cluster.knobs", "rlhf_helpers.cluster.option_names")
#: every explorer these tests make, kept until the run ends: a GAEExplorer collected while pytest
#: runs can abort the process in torch's tensor teardown (THPVariable_clear's use_count assert, on
#: main as well); tests/widgets keeps its explorers alive the same way (`shared`)
_KEPT: list[object] = []
LOGP = torch.tensor([[-1.2, -0.3, -2.0]], dtype=torch.float64)  # (1, 3)
REF = torch.tensor([[-0.9, -0.4, -3.1]], dtype=torch.float64)  # (1, 3)


def _flag(*argv: str) -> dict:
    """The PPOConfig values the training command's flags give (`add_field_flags`)."""
    parser = argparse.ArgumentParser(prog="train")
    add_field_flags(parser, PPOConfig)
    return given_field_values(parser.parse_args(list(argv)), PPOConfig)


def _kept(explorer: object) -> Any:
    """`explorer`, kept alive until the test run ends (`_KEPT`)."""
    _KEPT.append(explorer)
    return explorer


def _exported(config: PPOConfig, framework: str) -> str:
    """The KL estimator's name that `framework`'s export writes for `config`."""
    if framework == "verl":
        return export.verl_settings(config)["algorithm.kl_penalty"]
    return dict(export.openrlhf_flags(config))["--algo.kl.estimator"][0]


def test_the_registries_and_the_layers_that_check_their_names_import_no_torch():
    code = (f"import sys, {', '.join(TORCH_FREE)}; "
            "print(sorted({'torch', 'numpy', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_core_config_and_flag_take_every_registered_estimator(name):
    assert PPOConfig(kl_kind=name).kl_kind == name
    assert _flag("--kl-kind", name) == {"kl_kind": name}
    expected = KL_ESTIMATORS[name].function(REF - LOGP)  # (1, 3)
    assert torch.equal(kl_estimate(LOGP, REF, name), expected)


def test_core_config_and_flag_refuse_a_name_not_registered(capsys):
    names = ", ".join(repr(name) for name in KL_ESTIMATORS)
    with pytest.raises(ValueError) as refused:
        PPOConfig(kl_kind="k4")
    assert str(refused.value) == (f"kl_kind must be one of {names} (the KL estimators registered "
                                  "in rlhf_helpers/core/kl_estimators.py), got 'k4'")
    with pytest.raises(ValueError, match=r"^kind must be one of 'k1'"):
        kl_estimate(LOGP, REF, "k4")
    with pytest.raises(SystemExit) as exit_:
        _flag("--kl-kind", "k4")
    assert exit_.value.code == 2 and "invalid choice: 'k4'" in capsys.readouterr().err
    assert KL_KINDS == KL_ESTIMATORS.names() and "k4" not in KL_ESTIMATORS


def test_a_new_estimator_reaches_core_config_flag_export_and_explorers(monkeypatch):
    """One entry registered, nothing else changed: every reader takes it (before: the config's
    hand-written tuple refused it, the export had no verl name, the explorer assumed 3 curves)."""
    from rlhf_helpers.widgets import GAEExplorer, KLExplorer

    registered(monkeypatch, KL_ESTIMATORS, test_estimator(drawn=True))
    config = gpu_profile().ppo.replace(kl_kind="k_test")
    assert _flag("--kl-kind", "k_test") == {"kl_kind": "k_test"}
    assert torch.equal(kl_estimate(LOGP, REF, "k_test"), (REF - LOGP).abs())
    mask = torch.ones_like(LOGP)  # (1, 3)
    rewards, kl = shape_rewards(torch.tensor([1.0], dtype=torch.float64), LOGP, REF, mask, 0.5,
                                kl_kind="k_test")  # (1, 3) each
    assert torch.equal(kl, (REF - LOGP).abs()) and rewards[0, -1] == 1.0 - 0.5 * kl[0, -1]
    for framework in FRAMEWORKS:  # known to neither: sent as k1, and said so
        assert _exported(config, framework) == _exported(config.replace(kl_kind="k1"), framework)
        assert [line.split(":")[0] for line in export.not_carried(config, framework)] == [
            "kl_kind=k_test"]
    explorer = _kept(KLExplorer(backend="html"))
    assert explorer.kinds == drawn_kl_kinds() and explorer.kinds[-1] == "k_test"
    data = explorer.view.figure.data
    assert len(data) == 3 * len(explorer.kinds) + 1
    assert data[explorer.exact].name.startswith("exact")
    curve = data[explorer.curve + len(explorer.kinds) - 1]  # the last curve: the new estimator's
    assert curve.name == "k_test"
    np.testing.assert_allclose(np.asarray(curve.y, dtype=float),
                               np.abs(np.asarray(curve.x, dtype=float)), atol=1e-12)
    assert _kept(GAEExplorer(backend="html")).kind.options[-1] == "k_test"


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_every_estimator_is_exported_by_its_name_or_named_as_not_carried(framework, name):
    config = gpu_profile().ppo.replace(kl_kind=name)
    own = getattr(KL_ESTIMATORS[name], framework)
    named = [line for line in export.not_carried(config, framework) if line.startswith("kl_kind=")]
    if own is not None:
        assert _exported(config, framework) == own and named == []
    else:
        fallback = getattr(KL_ESTIMATORS[OPTION_FALLBACKS["kl_kind"]], framework)
        assert _exported(config, framework) == fallback and len(named) == 1


def test_an_estimator_one_framework_lacks_is_exported_to_the_other(monkeypatch, capsys):
    registered(monkeypatch, KL_ESTIMATORS, test_estimator("abs", verl="abs"))
    config = gpu_profile().ppo.replace(kl_kind="abs")
    assert _exported(config, "verl") == "abs" and export.not_carried(config, "verl") == []
    assert _exported(config, "openrlhf") == "k1"
    assert export.not_carried(config) == []  # None: what neither framework can carry
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"kl_kind": "abs"}')
    assert export.main(["--profile", "gpu", "--format", "openrlhf"]) == 0
    assert ("not carried over: kl_kind=abs: OpenRLHF has no KL estimator 'abs' "
            "(rlhf_helpers/core/kl_estimators.py): the export sends k1, what it does without the "
            "setting") in capsys.readouterr().err.splitlines()


def test_the_knob_note_names_the_registered_estimators_as_verl_calls_them():
    note = next(knob.note for knob in KNOBS if knob.course == "kl_kind")
    verl = [e for e in KL_ESTIMATORS.values() if e.verl]
    assert note.startswith(f"{'/'.join(e.name for e in verl)} are verl's "
                           f"{'/'.join(str(e.verl) for e in verl)}")


def test_the_explorers_draw_exactly_the_drawn_estimators(monkeypatch):
    """An estimator that is not `drawn` is accepted everywhere but drawn nowhere, so extending the
    registry cannot change an explorer's layout."""
    from rlhf_helpers.widgets import GAEExplorer, KLExplorer

    registered(monkeypatch, KL_ESTIMATORS, test_estimator(drawn=False))
    drawn = tuple(name for name, estimator in KL_ESTIMATORS.items() if estimator.drawn)
    assert drawn == drawn_kl_kinds() and "k_test" in KL_ESTIMATORS and "k_test" not in drawn
    explorer = _kept(KLExplorer(backend="html"))
    data = explorer.view.figure.data
    assert [trace.name for trace in data[explorer.curve:explorer.sampled]] == list(drawn)
    assert [trace.name for trace in data[explorer.box:explorer.exact]] == list(drawn)
    assert len(data) == explorer.exact + 1 == 3 * len(drawn) + 1
    assert tuple(_kept(GAEExplorer(backend="html")).kind.options) == drawn


def test_the_export_names_the_engines_advantage_estimator_from_its_registry(monkeypatch):
    gae = ADVANTAGE_ESTIMATORS[export.ENGINE_ADVANTAGE]
    assert gae.ppo_trainer and ADVANTAGE_FUNCTIONS[gae.name] is compute_gae
    renamed = dataclasses.replace(gae, verl="gae_renamed", openrlhf="gae_renamed_too")
    monkeypatch.setitem(ADVANTAGE_ESTIMATORS._entries, gae.name, renamed)
    assert export.verl_settings("gpu")["algorithm.adv_estimator"] == "gae_renamed"
    assert dict(export.openrlhf_flags("gpu"))["--algo.advantage.estimator"] == ("gae_renamed_too",)


def test_every_advantage_estimator_declared_has_its_function_and_no_other_name_can():
    assert ADVANTAGE_FUNCTIONS == {"gae": compute_gae, "rloo": rloo_advantages,
                                   "grpo": grpo_advantages}
    assert list(ADVANTAGE_FUNCTIONS) == list(ADVANTAGE_ESTIMATORS)
    with pytest.raises(ValueError, match="^advantage_estimator must be one of 'gae', 'rloo'"):
        advantage_estimator("ppo_gae")
    with pytest.raises(ValueError, match="'gae' already has a function: compute_gae"):
        advantage_estimator("gae")(lambda rewards: rewards)


def test_the_trainer_takes_exactly_the_registered_pieces():
    arguments = inspect.signature(PPOTrainer.__init__).parameters.values()
    keyword_only = [a.name for a in arguments if a.kind is inspect.Parameter.KEYWORD_ONLY]
    assert keyword_only == list(PIECES.names())
    assert [f.name for f in dataclasses.fields(pieces.Pieces)][:4] == [
        "shape_rewards", "advantages", "policy_loss", "value_loss"]


@pytest.mark.parametrize("name", PIECES.names())
def test_each_piece_is_called_and_documented_with_its_contracts_parameters(name):
    piece = PIECES[name]
    assert f"{name}({', '.join(piece.parameters)})" in pieces.__doc__
    if piece.library is not None:  # the library's own takes the same first arguments
        library = tuple(inspect.signature(piece.library).parameters)
        assert library[:len(piece.parameters)] == piece.parameters
    if name != "update_fn":  # the checked call: the caller's function, then the piece's arguments
        assert tuple(inspect.signature(piece.call).parameters)[1:] == piece.parameters


def test_the_trainer_runs_each_pieces_library_function_or_its_checked_call():
    """`resolve_pieces` spells out what each field holds; it must be what the registry says: the
    library's function when none is given (the shaping with the config's kl_kind), the registered
    checked call of a caller's."""
    def mine(*args):
        return args

    fields = {"shape_rewards_fn": "shape_rewards", "advantage_fn": "advantages",
              "policy_loss_fn": "policy_loss", "value_loss_fn": "value_loss"}
    library = pieces.resolve_pieces("k3", None, None, None, None, None)
    given = pieces.resolve_pieces("k3", None, *(mine for _ in fields))
    for name, field in fields.items():
        default, checked = getattr(library, field), getattr(given, field)
        if name == "shape_rewards_fn":
            assert default.func is PIECES[name].library and default.keywords["kl_kind"] == "k3"
        else:
            assert default is PIECES[name].library
        assert checked.func is PIECES[name].call and checked.args == (mine,)
    assert dict(given.given) == dict.fromkeys(fields, mine) and dict(library.given) == {}
