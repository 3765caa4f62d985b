"""The static site's parts that need no browser: the explorers' precomputed slider states against the maths
core, the links fitted to the site, the index from the README, and notebook outputs that need neither a
kernel nor the internet (tools/build_site.py, rlhf_helpers/widgets/static_explorer.py).

tests/test_site_browser.py checks the built site in Chromium (`make test` builds it after the notebook
tests); `expected_traces` here is the reference both use.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlhf_helpers.core.gae import compute_gae, td_errors
from rlhf_helpers.core.kl import shape_rewards
from rlhf_helpers.core.losses import clipped_surrogate, value_loss
from rlhf_helpers.widgets import KLExplorer, TokenResponse
from rlhf_helpers.widgets.static_explorer import SITE_SLIDERS, static_explorer, static_explorer_html

ROOT = Path(__file__).resolve().parents[1]
TOLERANCE = {"rtol": 1e-6, "atol": 1e-6}  #: the site keeps 7 significant digits


def _load_builder():
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_site", module)
    spec.loader.exec_module(module)
    return module


build_site = _load_builder()


def _float64(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def expected_traces(kind: str, params: dict, x: list[float]) -> dict[int, np.ndarray]:
    """What the maths core gives, for the explorer `kind` at control values `params`, for the traces the
    site's sliders move (by trace index), on the figure's own x values."""
    if kind == "ClipExplorer":
        ratio = _float64(x).requires_grad_(True)  # (N,)
        adv, eps = torch.full_like(ratio, params["advantage"]), params["eps"]
        dual = params["dual_clip"] if params.get("dual") else None
        objective = clipped_surrogate(ratio, adv, eps, dual)  # (N,)
        (gradient,) = torch.autograd.grad(objective.sum(), ratio)
        r = ratio.detach()
        # at a kink (1 ± eps) the derivative is a convention, and the page's x (7 digits) may sit on either side
        kink = ((r - (1 - eps)).abs() < 1e-6) | ((r - (1 + eps)).abs() < 1e-6)
        return {0: (r * adv).numpy(), 1: (r.clamp(1 - eps, 1 + eps) * adv).numpy(),
                2: objective.detach().numpy(), 4: np.where(kink.numpy(), np.nan, gradient.numpy())}
    if kind == "GAEExplorer":
        d = TokenResponse().tensors()
        rewards, _ = shape_rewards(_float64([params["score"]]), d["logprobs"], d["ref_logprobs"], d["mask"],
                                   params["kl_coef"], params["kl_kind"])  # (1, T)
        advantages, returns = compute_gae(rewards, d["values"], d["mask"], params["gamma"], params["lam"])
        deltas = td_errors(rewards, d["values"], d["mask"], params["gamma"])  # (1, T)
        return {2: rewards[0].numpy(), 3: deltas[0].numpy(), 4: advantages[0].numpy(), 6: returns[0].numpy()}
    if kind == "KLExplorer":
        result = KLExplorer(backend="html").compute(params["shift"], int(params["n_samples"]), int(params["seed"]))
        means = {6 + i: result["batch_means"][k].numpy() for i, k in enumerate(("k1", "k2", "k3"))}
        return {**means, 9: np.full(3, result["exact"])}
    if kind == "ValueClipExplorer":
        def loss(clip: float | None) -> np.ndarray:
            one = torch.ones(1, 1, dtype=torch.float64)
            return np.array([float(value_loss(_float64([[v]]), params["old_value"] * one, params["ret"] * one, one,
                                              clip)[0]) for v in x])
        return {0: loss(None), 1: loss(params["clip_range"])}
    raise ValueError(kind)


def state_params(figure: dict, index: int) -> dict:
    """The control values of the index-th stored state (row-major over the sliders, as the page's script)."""
    params = dict(figure["controls"])
    for slider, stride in zip(figure["layout"]["sliders"], figure["strides"], strict=True):
        position = index // stride % len(slider["steps"])
        params[slider["name"]] = float(slider["steps"][position]["value"])
    return params


FIGURES = {
    "ClipExplorer": ({"eps": 0.2, "advantage": 1.0, "ratio": 1.3}, {}),
    "ClipExplorer-batch": ({"eps": 0.2, "advantage": 1.0, "ratio": 1.3},
                           {"ratios": [0.7, 1.0, 1.1, 1.5], "ratio_range": (0.0, 2.0)}),
    "GAEExplorer": ({"gamma": 1.0, "lam": 0.95, "kl_coef": 0.1, "score": 1.6, "kl_kind": "k1"}, {}),
    "KLExplorer": ({"shift": 1.0, "n_samples": 16, "seed": 0}, {}),
    "ValueClipExplorer": ({"clip_range": 0.2, "old_value": 0.0, "ret": 1.0, "value": 0.5}, {}),
}


@pytest.mark.parametrize("name", FIGURES)
def test_every_stored_state_is_what_the_maths_core_computes(name: str) -> None:
    kind = name.split("-")[0]
    controls, options = FIGURES[name]
    figure = static_explorer(kind, controls, **options)
    sliders = figure["layout"]["sliders"]
    assert [s["name"] for s in sliders] == [s.name for s in SITE_SLIDERS[kind]]
    assert len(figure["states"]) == np.prod([len(s["steps"]) for s in sliders]) <= 80  # pages stay small
    for slider in sliders:  # the page opens at the notebook's values
        assert float(slider["steps"][slider["active"]]["value"]) == pytest.approx(float(controls[slider["name"]]))
    for index, state in enumerate(figure["states"]):
        params = state_params(figure, index)
        for trace, want in expected_traces(kind, params, figure["data"][0]["x"]).items():
            got = np.array(state["y"].get(str(trace), figure["data"][trace]["y"]), dtype=float)
            np.testing.assert_allclose(np.where(np.isnan(want), np.nan, got), want, **TOLERANCE,
                                       err_msg=f"{name} trace {trace} at {params}")


def test_the_state_a_page_opens_with_is_the_figure_it_draws_first() -> None:
    figure = static_explorer("ClipExplorer", {"advantage": -1.0})
    opening = sum(s["active"] * stride for s, stride in zip(figure["layout"]["sliders"], figure["strides"],
                                                            strict=True))
    for trace, y in figure["states"][opening]["y"].items():
        assert figure["data"][int(trace)]["y"] == y
    assert "A = -1" in figure["layout"]["title"]["text"]


def test_static_html_needs_only_the_pages_plotly_and_escapes_script_ends() -> None:
    figure = static_explorer("GAEExplorer", {})
    figure["layout"]["title"]["text"] = "</script><b>x</b>"
    page = static_explorer_html(figure, "gae-1")
    assert page.count("</script>") == 1 and "<\\/script>" in page
    assert "http" not in page and 'data-explorer="GAEExplorer"' in page


def test_a_value_the_explorer_rejects_is_an_error_not_a_silent_page() -> None:
    with pytest.raises(ValueError, match="ClipExplorer rejects"):
        static_explorer("ClipExplorer", {"ratio": -1.0})
    with pytest.raises(ValueError, match="kind"):
        static_explorer("Nope", {})


# ---------------------------------------------------------------- pages and links

PAGES = {*build_site.notebook_pages(), *build_site.REFERENCE_PAGES}


def test_links_fit_the_site() -> None:
    text = ("[map](notebooks/01_policy_gradients.ipynb) [n](notebooks/NOTATION.md#x) [r](README.md#colab) "
            "[file](rlhf_helpers/widgets/backends.py) [`rlhf_helpers/ppo`](rlhf_helpers/ppo/) "
            "![shot](docs/img/ppo_curve.png) [web](https://example.org) [here](#the-course-map)")
    fitted, images = build_site.rewrite_links(text, "README.md", PAGES)
    assert fitted == ("[map](notebooks/01_policy_gradients.ipynb) [n](notebooks/NOTATION.md#x) [r](index.md) "
                      "file (`rlhf_helpers/widgets/backends.py`) `rlhf_helpers/ppo` "
                      "![shot](docs/img/ppo_curve.png) [web](https://example.org) [here](#the-course-map)")
    assert images == {"docs/img/ppo_curve.png"}
    fitted, _ = build_site.rewrite_links("[a](../README.md) [b](results/x.json) [c](../docs/cluster.md)",
                                         "benchmarks/README.md", PAGES)
    assert fitted == "[a](../index.md) b (`benchmarks/results/x.json`) [c](../docs/cluster.md)"


def test_the_index_is_the_readme_course_map_with_every_page_in_order() -> None:
    index = build_site.index_markdown((ROOT / "README.md").read_text(encoding="utf-8"))
    assert index.startswith("# RLHF with PPO") and "## The course map" in index
    for page in build_site.notebook_pages():
        assert f"]({page})" in index
    toctrees = index.split("```{toctree}")[1:]
    listed = [line for tree in toctrees for line in tree.split("```")[0].splitlines()[3:] if line]
    assert listed == [p.rsplit(".", 1)[0] for p in [*build_site.notebook_pages(), *build_site.REFERENCE_PAGES]]
    assert len(build_site.notebook_pages()) == 7


def _bar_state() -> dict:
    html_model = "HTMLModel"
    return {
        "bar": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_a", "IPY_MODEL_b", "IPY_MODEL_c"]}},
        "a": {"model_name": html_model, "state": {"value": "PPO:\u2007100%"}},
        "b": {"model_name": "FloatProgressModel", "state": {"value": 6.0, "max": 6.0}},
        "c": {"model_name": html_model, "state": {"value": "\u20076/6\u2007[00:03&lt;00:00]"}},
    }


def test_site_notebook_keeps_no_output_that_needs_a_kernel_or_the_internet() -> None:
    figure = {"data": [{"type": "scatter", "y": [1, 2]}], "layout": {"width": 920, "height": 300}}
    nb = {"metadata": {"widgets": {build_site.STATE_MIME: {"state": _bar_state()}}}, "cells": [
        {"cell_type": "code", "source": "x", "outputs": [
            {"output_type": "display_data", "data": {"text/html": '<script src="https://cdn.plot.ly/p.js"></script>'}},
            {"output_type": "display_data", "data": {build_site.PLOTLY_MIME: figure, "text/html": "<div>cdn</div>"}},
            {"output_type": "display_data",
             "data": {build_site.WIDGET_MIME: {"model_id": "bar"}, "text/plain": "HBox"}},
            {"output_type": "stream", "name": "stdout", "text": "kept\n"}]}]}
    outputs = build_site.site_notebook(nb, "01_x")["cells"][0]["outputs"]
    assert "widgets" not in nb["metadata"]
    assert [o["output_type"] for o in outputs] == ["display_data", "stream", "stream"]
    html = outputs[0]["data"]["text/html"]
    assert list(outputs[0]["data"]) == ["text/html"] and "Plotly.newPlot" in html and "http" not in html
    assert '"width"' not in html and "height:300px" in html  # as wide as the page
    assert outputs[1]["text"] == "PPO: 100%|██████████| 6/6 [00:03<00:00]\n"
    assert outputs[2]["text"] == "kept\n"


@pytest.mark.parametrize("page", build_site.notebook_pages())
def test_executed_notebooks_become_pages_that_load_nothing_from_the_network(page: str) -> None:
    executed = build_site.EXECUTED / Path(page).name
    if build_site.stale_reason(ROOT / page, executed) is not None:
        pytest.skip(f"{executed}: {build_site.stale_reason(ROOT / page, executed)} (make test writes it)")
    nb = build_site.site_notebook(json.loads(executed.read_text()), Path(page).stem)
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if build_site.WIDGET_MIME in o.get("data", {}) or build_site.PLOTLY_MIME
                in o.get("data", {})]
    for out in outputs:
        text = json.dumps(out)
        assert "cdn." not in text and "src=\\\"http" not in text, f"{page}: {text[:300]}"
    explorers = sum("rlhf-static-explorer" in json.dumps(o) for o in outputs)
    assert explorers == {"03_gae": 2, "04_clip_loss": 3, "05_full_ppo": 1}.get(Path(page).stem, 0)
