"""The static site's parts that need no browser: the explorers' precomputed slider states against
the maths core, the links fitted to the site, the index from the README, and notebook outputs that
need neither a kernel nor the internet (tools/build_site.py,
rlhf_helpers/widgets/static_explorer.py).

tests/notebooks/test_site_browser.py checks the built site in Chromium (`make test` builds it after
the notebook tests); `expected_traces` here is the reference both use.
"""

from __future__ import annotations

import html as html_lib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tool_scripts import load_tool

from rlhf_helpers.core.gae import compute_gae, td_errors
from rlhf_helpers.core.kl import shape_rewards
from rlhf_helpers.core.losses import clipped_surrogate, value_loss
from rlhf_helpers.widgets import KLExplorer, TokenResponse
from rlhf_helpers.widgets.static_explorer import (
    SITE_SLIDERS,
    static_explorer,
    static_explorer_caption,
    static_explorer_html,
)

ROOT = Path(__file__).resolve().parents[2]
TOLERANCE = {"rtol": 1e-6, "atol": 1e-6}  #: the site keeps 7 significant digits


build_site = load_tool("build_site")


def _float64(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def expected_traces(kind: str, params: dict, x: list[float]) -> dict[int, np.ndarray]:
    """What the maths core gives, for the explorer `kind` at control values `params`, for the traces
    the site's sliders move (by trace index), on the figure's own x values."""
    if kind == "ClipExplorer":
        ratio = _float64(x).requires_grad_(True)  # (N,)
        adv, eps = torch.full_like(ratio, params["advantage"]), params["eps"]
        dual = params["dual_clip"] if params.get("dual") else None
        objective = clipped_surrogate(ratio, adv, eps, dual)  # (N,)
        (gradient,) = torch.autograd.grad(objective.sum(), ratio)
        r = ratio.detach()
        # at a kink (1 ± eps) the derivative is a convention, and the page's x (7 digits) may sit on
        # either side
        kink = ((r - (1 - eps)).abs() < 1e-6) | ((r - (1 + eps)).abs() < 1e-6)
        return {0: (r * adv).numpy(), 1: (r.clamp(1 - eps, 1 + eps) * adv).numpy(),
                2: objective.detach().numpy(), 4: np.where(kink.numpy(), np.nan, gradient.numpy())}
    if kind == "GAEExplorer":
        d = TokenResponse().tensors()
        rewards, _ = shape_rewards(_float64([params["score"]]), d["logprobs"], d["ref_logprobs"],
                                   d["mask"], params["kl_coef"], params["kl_kind"])  # (1, T)
        advantages, returns = compute_gae(rewards, d["values"], d["mask"],
                                          params["gamma"], params["lam"])
        deltas = td_errors(rewards, d["values"], d["mask"], params["gamma"])  # (1, T)
        return {2: rewards[0].numpy(), 3: deltas[0].numpy(), 4: advantages[0].numpy(),
                6: returns[0].numpy()}
    if kind == "KLExplorer":
        result = KLExplorer(backend="html").compute(params["shift"], int(params["n_samples"]),
                                                    int(params["seed"]))
        means = {6 + i: result["batch_means"][k].numpy() for i, k in enumerate(("k1", "k2", "k3"))}
        return {**means, 9: np.full(3, result["exact"])}
    if kind == "ValueClipExplorer":
        def loss(clip: float | None) -> np.ndarray:
            one = torch.ones(1, 1, dtype=torch.float64)
            return np.array([float(value_loss(_float64([[v]]), params["old_value"] * one,
                                              params["ret"] * one, one, clip)[0]) for v in x])
        return {0: loss(None), 1: loss(params["value_clip"])}
    raise ValueError(kind)


def state_params(figure: dict, index: int) -> dict:
    """The control values of the index-th stored state (row-major over the sliders, as the page's
    script)."""
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
    "ValueClipExplorer": ({"value_clip": 0.2, "old_value": 0.0, "ret": 1.0, "value": 0.5}, {}),
}


@pytest.mark.parametrize("name", FIGURES)
def test_every_stored_state_is_what_the_maths_core_computes(name: str) -> None:
    kind = name.split("-")[0]
    controls, options = FIGURES[name]
    figure = static_explorer(kind, controls, **options)
    sliders = figure["layout"]["sliders"]
    assert [s["name"] for s in sliders] == [s.name for s in SITE_SLIDERS[kind]]
    # pages stay small
    assert len(figure["states"]) == np.prod([len(s["steps"]) for s in sliders]) <= 80
    for slider in sliders:  # the page opens at the notebook's values
        assert (float(slider["steps"][slider["active"]]["value"])
                == pytest.approx(float(controls[slider["name"]])))
    for index, state in enumerate(figure["states"]):
        params = state_params(figure, index)
        for trace, want in expected_traces(kind, params, figure["data"][0]["x"]).items():
            got = np.array(state["y"].get(str(trace), figure["data"][trace]["y"]), dtype=float)
            np.testing.assert_allclose(np.where(np.isnan(want), np.nan, got), want, **TOLERANCE,
                                       err_msg=f"{name} trace {trace} at {params}")


def test_the_state_a_page_opens_with_is_the_figure_it_draws_first() -> None:
    figure = static_explorer("ClipExplorer", {"advantage": -1.0})
    opening = sum(s["active"] * stride for s, stride in zip(figure["layout"]["sliders"],
                                                            figure["strides"], strict=True))
    for trace, y in figure["states"][opening]["y"].items():
        assert figure["data"][int(trace)]["y"] == y
    assert "A = -1" in figure["layout"]["title"]["text"]


def test_static_html_needs_only_the_pages_plotly_and_escapes_script_ends() -> None:
    figure = static_explorer("GAEExplorer", {})
    figure["layout"]["title"]["text"] = "</script><b>x</b>"
    page = static_explorer_html(figure, "gae-1")
    assert page.count("</script>") == 1 and "<\\/script>" in page
    assert "http" not in page and 'data-explorer="GAEExplorer"' in page


#: the caption under each explorer: its sliders' and its fixed controls' labels as the notebook
#: names them
CAPTIONS = {
    "ClipExplorer": ("sliders for advantage A and clip ε",
                     "Fixed here: ratio ρ = 1.3, dual clip off."),
    "GAEExplorer": ("sliders for GAE λ and KL coef β",
                    "Fixed here: discount γ = 1, score = 1.6, KL estimator = k1."),
    "KLExplorer": ("a slider for π far from ref", "Fixed here: tokens / batch = 16, seed = 0."),
    "ValueClipExplorer": ("sliders for {ret} and clip range ε_V",  # {ret}: the return's label, G^λ
                          "Fixed here: old value V_old = 0, new value V = 0.5."),
}


@pytest.mark.parametrize("name", [n for n in FIGURES if "-" not in n])
def test_the_caption_names_every_slider_and_every_fixed_control_with_its_value(name: str) -> None:
    controls, options = FIGURES[name]
    figure = static_explorer(name, controls, **options)
    caption = static_explorer_caption(figure)
    sliders, fixed = (part.format(**figure["labels"]) for part in CAPTIONS[name])
    assert caption == (f"On this page: {sliders}. {fixed} Run the notebook (JupyterLab or Colab) "
                       "to move the others.")
    for slider in figure["layout"]["sliders"]:
        assert figure["labels"][slider["name"]] in caption
    page = static_explorer_html(figure, "x-1")
    assert page.endswith(f'<p class="rlhf-explorer-caption">{html_lib.escape(caption)}</p>')


def test_the_caption_shows_the_dual_clip_only_when_it_is_on() -> None:
    caption = static_explorer_caption(
        static_explorer("ClipExplorer", {"dual": True, "dual_clip": 3.0, "ratio": 0.8}))
    assert "Fixed here: ratio ρ = 0.8, dual clip on, dual clip c_dual = 3." in caption
    assert ("c_dual"
            not in static_explorer_caption(static_explorer("ClipExplorer", {"dual_clip": 3.0})))


def test_the_clip_slider_comes_as_close_to_eps_0_as_the_maths_core_allows() -> None:
    figure = static_explorer("ClipExplorer", {})
    eps = [float(step["value"]) for step in figure["layout"]["sliders"][1]["steps"]]
    assert eps == [0.05, 0.1, 0.2, 0.3]
    with pytest.raises(ValueError, match="clip_eps must be"):  # why 0 itself is not a step
        static_explorer("ClipExplorer", {"eps": 0.0})


def test_a_value_the_explorer_rejects_is_an_error_not_a_silent_page() -> None:
    with pytest.raises(ValueError, match="ClipExplorer rejects"):
        static_explorer("ClipExplorer", {"ratio": -1.0})
    with pytest.raises(ValueError, match="kind"):
        static_explorer("Nope", {})


# ---------------------------------------------------------------- pages and links

PAGES = {*build_site.notebook_pages(), *build_site.REFERENCE_PAGES}


GITHUB = "https://github.com/rlhf-course/rlhf-ppo-course"


def test_links_fit_the_site() -> None:
    text = ("[map](notebooks/01_policy_gradients.ipynb) [n](notebooks/NOTATION.md#x) "
            "[r](README.md#colab) "
            "[file](rlhf_helpers/widgets/backends.py) [`rlhf_helpers/ppo`](rlhf_helpers/ppo/) "
            "![shot](docs/img/ppo_curve.png) [web](https://example.org) [here](#the-course-map)")
    fitted, images = build_site.rewrite_links(text, "README.md", PAGES)
    assert fitted == (
        "[map](notebooks/01_policy_gradients.ipynb) [n](notebooks/NOTATION.md#x) [r](index.md) "
        f"[file]({GITHUB}/blob/main/rlhf_helpers/widgets/backends.py) "
        f"[`rlhf_helpers/ppo`]({GITHUB}/tree/main/rlhf_helpers/ppo) "
        "![shot](docs/img/ppo_curve.png) [web](https://example.org) [here](#the-course-map)")
    assert images == {"docs/img/ppo_curve.png"}
    fitted, _ = build_site.rewrite_links(
        "[a](../README.md) [b](results/x.json) [c](../docs/cluster.md)",
        "benchmarks/README.md", PAGES)
    # not in git
    assert fitted == "[a](../index.md) b (`benchmarks/results/x.json`) [c](../docs/cluster.md)"


def test_a_link_whose_label_abbreviates_the_path_stays_one_link() -> None:
    text = ("([results/.../profile.json](results/gpu-h100-2026-11-24/profile.json), 5.76 s under "
            "the profiler)")
    fitted, _ = build_site.rewrite_links(text, "benchmarks/README.md", PAGES)
    assert fitted == ("([results/.../profile.json]"
                      f"({GITHUB}/blob/main/benchmarks/results/gpu-h100-2026-11-24/profile.json), "
                      "5.76 s under the profiler)")


def test_the_repository_is_the_one_the_colab_set_up_cell_clones() -> None:
    assert build_site.GITHUB == GITHUB
    cells = json.loads((ROOT / "notebooks" / "01_policy_gradients.ipynb").read_text())["cells"]
    assert any(f'"{GITHUB}"' in "".join(cell["source"]) for cell in cells
               if cell["cell_type"] == "code")


def test_the_index_is_the_readme_course_map_with_every_page_in_order() -> None:
    index = build_site.index_markdown((ROOT / "README.md").read_text(encoding="utf-8"))
    assert index.startswith("# RLHF with PPO") and "## The course map" in index
    run_it = index.split("\n\n")[2]  # right under the opening paragraph
    assert (run_it.startswith("**Run it yourself:**") and f"]({GITHUB})" in run_it
            and "`make lab`" in run_it)
    for page in build_site.notebook_pages():
        assert f"]({page})" in index
    toctrees = index.split("```{toctree}")[1:]
    listed = [line for tree in toctrees for line in tree.split("```")[0].splitlines()[3:] if line]
    assert listed == [p.rsplit(".", 1)[0]
                      for p in [*build_site.notebook_pages(), *build_site.REFERENCE_PAGES]]
    assert len(build_site.notebook_pages()) == 8


def _bar_state(key: str = "bar", left: str = "PPO:\u2007100%",
               right: str = "\u20076/6\u2007[00:03&lt;00:00]", hidden: bool = False) -> dict:
    """A saved tqdm.notebook bar, as ipywidgets state: an HBox of description, progress and
    counter."""
    html_model = "HTMLModel"
    return {
        key: {"model_name": "HBoxModel",
              "state": {"children": [f"IPY_MODEL_{key}{p}" for p in "abc"],
                        "layout": f"IPY_MODEL_{key}l"}},
        f"{key}a": {"model_name": html_model, "state": {"value": left}},
        f"{key}b": {"model_name": "FloatProgressModel", "state": {"value": 6.0, "max": 6.0}},
        f"{key}c": {"model_name": html_model, "state": {"value": right}},
        f"{key}l": {"model_name": "LayoutModel",
                    "state": {"visibility": "hidden" if hidden else None}},
    }


def _bar(key: str) -> dict:
    return {"output_type": "display_data",
            "data": {build_site.WIDGET_MIME: {"model_id": key}, "text/plain": "HBox"}}


def test_site_notebook_keeps_no_output_that_needs_a_kernel_or_the_internet() -> None:
    figure = {"data": [{"type": "scatter", "y": [1, 2]}], "layout": {"width": 920, "height": 300}}
    nb = {"metadata": {"widgets": {build_site.STATE_MIME: {"state": _bar_state()}}}, "cells": [
        {"cell_type": "code", "source": "x", "outputs": [
            {"output_type": "display_data",
             "data": {"text/html": '<script src="https://cdn.plot.ly/p.js"></script>'}},
            {"output_type": "display_data",
             "data": {build_site.PLOTLY_MIME: figure, "text/html": "<div>cdn</div>"}},
            _bar("bar"),
            {"output_type": "stream", "name": "stdout", "text": "kept\n"}]}]}
    outputs = build_site.site_notebook(nb, "01_x")["cells"][0]["outputs"]
    assert "widgets" not in nb["metadata"]
    assert [o["output_type"] for o in outputs] == ["display_data", "display_data", "stream"]
    html = outputs[0]["data"]["text/html"]
    assert (list(outputs[0]["data"]) == ["text/html"] and "rlhfFigures.draw(" in html
            and "http" not in html)
    assert '"width"' not in html and "height:300px" in html  # as wide as the page
    # a finished bar: its last text, a muted line (not stderr, which the theme shows as an error)
    assert outputs[1]["data"] == {"text/html": '<pre class="rlhf-progress">PPO: 100%|██████████| '
                                               '6/6 [00:03&lt;00:00]</pre>'}
    assert outputs[2]["text"] == "kept\n"


def test_bars_the_code_closed_and_the_datasets_librarys_bars_are_dropped() -> None:
    state = {**_bar_state("kept"), **_bar_state("hidden", left="training:\u2007100%", hidden=True),
             **_bar_state("leave", left="step sizes:\u2007100%"),
             **_bar_state("leave_f", left="seed 3:\u2007100%"),
             **_bar_state("map", left="Tokenizing train dataset:\u2007100%",
                          right="\u2007256/256\u2007[00:00&lt;00:00, 1585.96 examples/s]")}
    source = ('for eta in tqdm(step_sizes, desc="step sizes", leave=False):\n    pass\n'
              'for s in tqdm(range(3), desc=f"seed {seed}",\n              leave=False):\n    '
              'pass\n')
    nb = {"metadata": {"widgets": {build_site.STATE_MIME: {"state": state}}}, "cells": [
        {"cell_type": "code", "source": source,
         "outputs": [_bar(k) for k in ("hidden", "leave", "leave_f", "map",
                                       "kept")]}]}
    outputs = build_site.site_notebook(nb, "01_x")["cells"][0]["outputs"]
    assert [o["data"]["text/html"][:36]
            for o in outputs] == ['<pre class="rlhf-progress">PPO: 100%']


def test_an_exercise_not_done_says_where_to_write_it() -> None:
    line = ("NOT DONE  Exercise 1 (clipped_objective): the stub still raises NotImplementedError; "
            "fill it in, or open the solution below.\n")
    nb = {"metadata": {},
          "cells": [{"cell_type": "code", "source": "exercise_check(...)", "outputs": [
        {"output_type": "stream", "name": "stdout", "text": ["before\n", line, "after\n"]},
        {"output_type": "stream", "name": "stdout", "text": "PASSED  Exercise 2 (x)\n"}]}]}
    outputs = build_site.site_notebook(nb, "04_x")["cells"][0]["outputs"]
    assert (outputs[0]["text"]
            == ("before\nExercise 1 (clipped_objective): write it in the notebook (JupyterLab or "
                                  "Colab), where this check runs; the solution is below.\nafter\n"))
    assert outputs[1]["text"] == "PASSED  Exercise 2 (x)\n"


def test_an_image_output_gets_an_alt_text_not_its_file_path() -> None:
    image = {"output_type": "display_data",
             "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Image>"}}
    nb = {"metadata": {}, "cells": [
        {"cell_type": "code", "metadata": {},
         "source": 'display(Image("docs/img/algorithms_frontier.png"))', "outputs": [dict(image)]},
        {"cell_type": "code", "metadata": {}, "source": 'display(Image("docs/img/other_plot.png"))',
         "outputs": [dict(image)]}]}
    cells = build_site.site_notebook(nb, "07_x",
                                     {"algorithms_frontier.png": "PPO vs GRPO"})["cells"]
    assert cells[0]["metadata"]["mystnb"]["image"]["alt"] == "PPO vs GRPO"
    assert cells[1]["metadata"]["mystnb"]["image"]["alt"] == "figure: other plot"


def _skip_unless_ci(reason: str) -> None:
    """Skip a check of what `make test` builds when it is not there; on CI (CI=true) that is a
    failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"cannot check the site on CI: {reason}")
    pytest.skip(reason)


@pytest.mark.site  # after the notebook runs (make test): they write build/executed/
@pytest.mark.parametrize("page", build_site.notebook_pages())
def test_executed_notebooks_become_pages_that_load_nothing_from_the_network(page: str) -> None:
    executed = build_site.EXECUTED / Path(page).name
    if build_site.stale_reason(ROOT / page, executed) is not None:
        _skip_unless_ci(
            f"{executed}: {build_site.stale_reason(ROOT / page, executed)} (make test writes it)")
    nb = build_site.site_notebook(json.loads(executed.read_text()), Path(page).stem)
    outputs = [o for c in nb["cells"] for o in c.get("outputs", [])]
    assert not [o for o in outputs if build_site.WIDGET_MIME in o.get("data", {})
                or build_site.PLOTLY_MIME in o.get("data", {})]
    for out in outputs:
        text = json.dumps(out)
        assert "cdn." not in text and "src=\\\"http" not in text, f"{page}: {text[:300]}"
    explorers = sum("rlhf-static-explorer" in json.dumps(o) for o in outputs)
    assert explorers == {"03_gae": 2, "04_clip_loss": 3, "05_full_ppo": 1}.get(Path(page).stem, 0)
    assert sum("rlhf-explorer-caption" in json.dumps(o) for o in outputs) == explorers
    texts = ["".join(o["text"]) for o in outputs if o["output_type"] == "stream"]
    assert not [t for t in texts
                if build_site.EXERCISE_TODO in t], f"{page}: an exercise says NOT DONE"
    assert not [o for o in outputs if o.get("name") == "stderr" and "%|" in "".join(o["text"])], \
        f"{page}: a progress bar as stderr"


# ---------------------------------------------------------------- the built site (skipped when not
# built)

SITE = ROOT / "build" / "site"


def _built() -> list[Path]:
    if not (SITE / "index.html").is_file():
        _skip_unless_ci(f"{SITE}/index.html is missing: build the site first (make site)")
    return sorted(p for p in SITE.rglob("*.html") if "_static" not in p.parts)


@pytest.mark.site  # after make site (make test builds it)
def test_the_built_pages_show_no_progress_bar_as_an_error_and_no_exercise_as_not_done() -> None:
    for page in _built():
        text = page.read_text(encoding="utf-8")
        stderr = re.findall(r'<div class="output stderr">.*?</div>', text, re.S)
        assert not [s for s in stderr
                    if "%|" in s or "it/s" in s], f"{page}: a progress bar shown as stderr"
        assert (f">{build_site.EXERCISE_TODO} " not in text
                and f"\n{build_site.EXERCISE_TODO} " not in text), page
    for name, count in {"03_gae": 2, "04_clip_loss": 3, "05_full_ppo": 1}.items():
        text = (SITE / "notebooks" / f"{name}.html").read_text(encoding="utf-8")
        captions = re.findall(r'<p class="rlhf-explorer-caption">(On this page: .*?)</p>', text)
        assert len(captions) == text.count('class="rlhf-static-explorer"') == count, name


@pytest.mark.site  # after make site (make test builds it)
def test_no_page_shows_the_folders_of_the_machine_that_built_it() -> None:
    """Outputs print paths relative to the course (`artifacts.shown_path`): a reader never sees the
    builder's checkout, e.g. in front of runs/reward-tiny or data/models/tiny-sft."""
    for page in _built():
        assert str(ROOT) not in page.read_text(encoding="utf-8"), f"{page} shows {ROOT}"


@pytest.mark.site  # after make site (make test builds it)
def test_a_generated_block_inside_a_sentence_stays_in_its_paragraph() -> None:
    """docs/cluster.md's first sentence ends in a generated block (the pinned versions): a marker
    comment on a line of its own would start an HTML block and split the sentence into two
    paragraphs."""
    text = (SITE / "docs" / "cluster.html").read_text(encoding="utf-8")
    paragraphs = [re.sub(r"<[^>]+>", "", p) for p in re.findall(r"<p>(.*?)</p>", text, re.S)]
    first = next(p for p in paragraphs if "to their settings, for" in p)
    assert re.search(r"for\s+verl \d", first), first


@pytest.mark.site  # after make site (make test builds it)
def test_every_github_link_of_the_built_site_names_a_file_or_folder_of_the_repository() -> None:
    pages = _built()
    tracked = set(subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                                 check=True, text=True).stdout.split("\0"))
    folders = {"/".join(f.split("/")[:i]) for f in tracked for i in range(1, f.count("/") + 1)}
    links = set()
    for page in pages:
        links |= set(re.findall(rf'href="({GITHUB}[^"#?]*)', page.read_text(encoding="utf-8")))
    assert GITHUB in links  # the theme's repository button
    for link in sorted(links - {GITHUB}):
        kind, branch, path = re.fullmatch(rf"{GITHUB}/(blob|tree)/([^/]+)/(.+)", link).groups()
        assert branch == "main", link
        assert path in (tracked if kind == "blob" else folders), f"{link}: not in git ls-files"
    # the benchmarks page's result files
    assert any("/benchmarks/results/" in link for link in links)


def test_an_executed_copy_cut_short_is_stale_not_a_traceback(tmp_path) -> None:
    stored = ROOT / "notebooks" / "01_policy_gradients.ipynb"  # the first one --no-execute looks at
    cut = tmp_path / stored.name
    # a run killed mid-write
    cut.write_text(stored.read_text(encoding="utf-8")[:5000], encoding="utf-8")
    assert build_site.stale_reason(stored, cut) == "unreadable (JSONDecodeError)"
    cut.write_bytes(b"\xff\xfe{}")
    assert build_site.stale_reason(stored, cut) == "unreadable (UnicodeDecodeError)"
    cut.write_text('{"cells": 3}', encoding="utf-8")
    assert build_site.stale_reason(stored, cut) == "unreadable (TypeError)"
    with pytest.raises(SystemExit, match="is unreadable"):
        build_site.main(
            ["--executed", str(tmp_path), "--out", str(tmp_path / "site"), "--no-execute"])


def _sphinx_output(tmp_path: Path, name: str, *pages: str) -> Path:
    """A folder as Sphinx leaves it: `pages` (relative paths) and its .buildinfo."""
    built = tmp_path / name
    for page in (".buildinfo", *pages):
        (built / page).parent.mkdir(parents=True, exist_ok=True)
        (built / page).write_text(f"{name}: {page}")
    return built


def test_the_site_replaces_only_a_site_it_built(tmp_path) -> None:
    first = _sphinx_output(tmp_path, "first", "index.html", "notebooks/01_a.html", "_static/old.js")
    second = _sphinx_output(tmp_path, "second", "index.html", "notebooks/02_b.html")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's file")
    with pytest.raises(SystemExit, match="is not a site this tool built"):
        build_site.replace_site(first, mine)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    site = tmp_path / "new" / "site"
    build_site.replace_site(first, site)
    assert (site / "notebooks" / "01_a.html").read_text() == "first: notebooks/01_a.html"
    build_site.replace_site(second, site)  # the first build's files go, folders it emptied too
    assert build_site.site_entries(site) == sorted(
        [".buildinfo", build_site.SITE_MARKER, "index.html", "notebooks/02_b.html"])
    assert (site / "index.html").read_text() == "second: index.html"
    assert build_site.files_written(site) == {".buildinfo", "index.html", "notebooks/02_b.html"}
    assert not list(tmp_path.glob("**/jupyter_execute"))


def test_the_site_never_deletes_a_file_it_did_not_write(tmp_path) -> None:
    """Before: any folder with a .buildinfo was deleted whole, a person's files in it too."""
    built = _sphinx_output(tmp_path, "built", "index.html")
    theirs = _sphinx_output(tmp_path, "theirs", "index.html")  # another Sphinx site: a .buildinfo
    (theirs / "thesis.tex").write_text("a user's file")
    with pytest.raises(SystemExit, match="is not a site this tool built"):
        build_site.replace_site(built, theirs)
    assert (theirs / "thesis.tex").read_text() == "a user's file"
    assert (theirs / "index.html").read_text() == "theirs: index.html"
    site = tmp_path / "site"
    build_site.replace_site(built, site)
    (site / "notes").mkdir()
    (site / "notes" / "todo.txt").write_text("a user's file")
    (site / "link.html").symlink_to(theirs / "thesis.tex")
    with pytest.raises(SystemExit, match=r"holds link.html, notes/todo.txt, which this tool "
                                         r"did not write: .*\(nothing was deleted\)"):
        build_site.replace_site(built, site)
    assert (site / "notes" / "todo.txt").read_text() == "a user's file"
    assert (site / "index.html").read_text() == "built: index.html"
    # a marker of another writer, or not JSON, marks nothing
    for text in ('{"written_by": "someone", "files": ["notes/todo.txt"]}', "not json"):
        (site / build_site.SITE_MARKER).write_text(text)
        with pytest.raises(SystemExit, match="is not a site this tool built"):
            build_site.replace_site(built, site)
    assert (site / "notes" / "todo.txt").read_text() == "a user's file"
    # a file or a link as --out
    for out in (theirs / "thesis.tex", site / "link.html"):
        with pytest.raises(SystemExit, match="not a folder"):
            build_site.replace_site(built, out)
    assert (theirs / "thesis.tex").read_text() == "a user's file"


def test_the_checkouts_own_site_built_before_the_marker_is_replaced_and_no_other_folder_is(
        tmp_path, monkeypatch) -> None:
    """build/site of a checkout that built its site before the marker existed (Sphinx's .buildinfo
    only) is replaced: build/ is where make writes. The same folder anywhere else is refused, and an
    --out that would be refused is refused before the minutes of building."""
    old = _sphinx_output(tmp_path / "build", "site", "index.html", "notebooks/01_a.html")
    elsewhere = _sphinx_output(tmp_path, "elsewhere", "index.html")
    monkeypatch.setattr(build_site, "OUT", old)
    assert build_site.out_problem(old) is None
    assert "is not a site this tool built" in build_site.out_problem(elsewhere)
    built = _sphinx_output(tmp_path, "built", "index.html")
    build_site.replace_site(built, old)
    assert build_site.site_entries(old) == sorted([".buildinfo", build_site.SITE_MARKER,
                                                   "index.html"])
    assert (old / "index.html").read_text() == "built: index.html"
    monkeypatch.setattr(build_site, "ensure_executed", lambda *_: pytest.fail("built first"))
    with pytest.raises(SystemExit, match="is not a site this tool built"):
        build_site.main(["--executed", str(tmp_path), "--out", str(elsewhere)])


def test_an_out_under_a_file_is_refused_in_one_line_before_the_build(tmp_path, monkeypatch,
                                                                     capsys):
    """Before: `--out afile/site` (afile a file) built the site, then ended in a NotADirectoryError
    traceback."""
    afile = tmp_path / "afile"
    afile.write_text("a user's file", encoding="utf-8")
    monkeypatch.setattr(build_site, "ensure_executed", lambda *_: pytest.fail("built first"))
    for out in (afile / "site", afile / "deeper" / "site"):
        message = (f"--out {out} cannot be made: {afile} is a file, not a folder; choose another "
                   "path")
        assert build_site.out_problem(out) == message
        with pytest.raises(SystemExit) as refused:
            build_site.main(["--executed", str(tmp_path), "--out", str(out)])
        assert refused.value.code == 2 and str(refused.value) == message
        assert capsys.readouterr().err == f"tools/build_site.py: error: {message}\n"
    assert afile.read_text(encoding="utf-8") == "a user's file"
    assert build_site.out_problem(tmp_path / "new" / "site") is None  # a folder it can make


def _small_notebook(*sources: str) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
            "cells": [{"cell_type": "code", "metadata": {}, "execution_count": None,
                       "outputs": [], "source": s}
                      for s in sources]}


def test_a_notebook_saved_while_the_build_executes_it_neither_breaks_nor_changes_the_build(
        tmp_path, monkeypatch):
    from rlhf_helpers.course import run_course

    notebooks, executed = tmp_path / "notebooks", tmp_path / "executed"
    notebooks.mkdir()
    first, second = _small_notebook("x = 1"), _small_notebook("y = 2", "print(y)")
    (notebooks / "01_a.ipynb").write_text(json.dumps(first), encoding="utf-8")
    (notebooks / "02_b.ipynb").write_text(json.dumps(second), encoding="utf-8")
    ran = []

    def execute(path: Path, out: Path, timeout: int) -> None:  # a kernel's run, without the kernel
        ran.append(path)
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(nb), encoding="utf-8")

    def saved_meanwhile(command: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
        # the editor's save as the run starts: one notebook is gone for a moment, the other holds
        # new cells
        (notebooks / "01_a.ipynb").unlink()
        (notebooks / "02_b.ipynb").write_text(json.dumps(_small_notebook("y = 3")),
                                              encoding="utf-8")
        module = command.index("rlhf_helpers.course.run_course")
        return subprocess.CompletedProcess(command, run_course.main(command[module + 1 :]))

    monkeypatch.setattr(run_course, "execute_notebook", execute)
    monkeypatch.setattr(build_site.subprocess, "run", saved_meanwhile)
    build_site.ensure_executed(executed, notebooks)
    assert sorted(p.name for p in ran) == ["01_a.ipynb", "02_b.ipynb"]
    assert all(notebooks not in p.parents for p in ran)  # the copies ran, not the files being saved
    # each as it was read, executed
    for name, stored in (("01_a.ipynb", first), ("02_b.ipynb", second)):
        done = json.loads((executed / name).read_text(encoding="utf-8"))
        assert [c["source"] for c in done["cells"]] == [c["source"] for c in stored["cells"]]
        assert all(c["outputs"] for c in done["cells"])
    (notebooks / "01_a.ipynb").write_text(json.dumps(first), encoding="utf-8")  # the save is over
    assert build_site.stale_reason(notebooks / "01_a.ipynb", executed / "01_a.ipynb") is None
    assert build_site.stale_reason(notebooks / "02_b.ipynb", executed / "02_b.ipynb") == (
        "from an older version of the notebook")  # run again next time


def test_a_notebook_read_while_it_is_written_is_read_again_then_named(tmp_path, monkeypatch):
    whole = json.dumps(_small_notebook("x = 1", "x + 1"))
    stored, executed = tmp_path / "01_a.ipynb", tmp_path / "executed.ipynb"
    executed.write_text(whole, encoding="utf-8")
    stored.write_text(whole[: len(whole) // 2], encoding="utf-8")  # a plain write seen half done
    pauses = []

    def the_write_ends(seconds: float) -> None:
        pauses.append(seconds)
        stored.write_text(whole, encoding="utf-8")

    monkeypatch.setattr(build_site.time, "sleep", the_write_ends)
    assert build_site.stale_reason(stored, executed) is None
    assert len(pauses) == 1
    monkeypatch.setattr(build_site.time, "sleep", lambda seconds: None)
    stored.write_text(whole[:100], encoding="utf-8")  # a write that never ends
    with pytest.raises(SystemExit) as cut:
        build_site.stale_reason(stored, executed)
    assert str(stored) in str(cut.value) and "\n" not in str(cut.value)
    stored.unlink()
    with pytest.raises(SystemExit, match=rf"{re.escape(str(stored))}: missing"):
        build_site.read_stored(stored)


def test_run_course_runs_the_notebooks_of_the_folder_it_is_given(tmp_path, monkeypatch, capsys):
    from rlhf_helpers.course import run_course

    (tmp_path / "01_a.ipynb").write_text(json.dumps(_small_notebook("x = 1")), encoding="utf-8")
    (tmp_path / "notes.ipynb").write_text("{}", encoding="utf-8")  # not a course notebook
    ran = []
    monkeypatch.setattr(run_course, "execute_notebook", lambda path, out,
                        timeout: ran.append((path, out)))
    assert run_course.main(["--notebooks", str(tmp_path), "--out", str(tmp_path / "out")]) == 0
    assert ran == [(tmp_path / "01_a.ipynb", tmp_path / "out" / "01_a.ipynb")]
    with pytest.raises(SystemExit):
        run_course.main(["--notebooks", str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    assert "--notebooks" in capsys.readouterr().err


def _fake_runs(monkeypatch) -> list[str]:
    """ensure_executed's run_course without a kernel: each notebook "ran" with one output a cell;
    returns the names run."""
    from rlhf_helpers.course import run_course

    ran = []

    def execute(path: Path, out: Path, timeout: int) -> None:
        ran.append(path.name)
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(nb), encoding="utf-8")

    def run_here(command: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
        module = command.index("rlhf_helpers.course.run_course")
        return subprocess.CompletedProcess(command, run_course.main(command[module + 1 :]))

    monkeypatch.setattr(run_course, "execute_notebook", execute)
    monkeypatch.setattr(build_site.subprocess, "run", run_here)
    return ran


def test_an_executed_notebook_a_person_edited_is_refused_by_name_and_kept(tmp_path, monkeypatch,
                                                                         capsys):
    """Before: a person's edited copy in --executed was judged "from an older version", run again
    and copied over: their edits were lost."""
    from rlhf_helpers.course.tool_files import write_recorded

    notebooks, executed = tmp_path / "notebooks", tmp_path / "executed"
    notebooks.mkdir()
    (notebooks / "01_a.ipynb").write_text(json.dumps(_small_notebook("x = 1")), encoding="utf-8")
    ran = _fake_runs(monkeypatch)
    build_site.ensure_executed(executed, notebooks)  # missing: run and written, with its record
    assert ran == ["01_a.ipynb"]
    mine = json.dumps(_small_notebook("x = 1  # my own note"))
    for how in ("never written by the tool", "edited after the tool wrote it"):
        if how == "never written by the tool":
            (executed / ".01_a.ipynb.sha256").unlink(missing_ok=True)
        else:
            write_recorded(executed / "01_a.ipynb", b"{}")
        (executed / "01_a.ipynb").write_text(mine, encoding="utf-8")
        with pytest.raises(SystemExit) as refused:
            build_site.ensure_executed(executed, notebooks)
        err = capsys.readouterr().err.strip().splitlines()
        assert refused.value.code == 2 and len(err) == 1, err
        assert (f"{executed / '01_a.ipynb'} was " in err[0]
                and "(from an older version of the notebook)" in err[0]
                and "Move them away" in err[0]), err
        assert (executed / "01_a.ipynb").read_text(encoding="utf-8") == mine
    assert ran == ["01_a.ipynb"]  # refused before running
    # the tool's own stale copy is run again and replaced
    write_recorded(executed / "01_a.ipynb", mine.encode())
    build_site.ensure_executed(executed, notebooks)
    assert ran == ["01_a.ipynb"] * 2
    assert build_site.stale_reason(notebooks / "01_a.ipynb", executed / "01_a.ipynb") is None


def test_an_executed_copy_that_is_a_link_is_refused_and_its_target_kept(tmp_path, monkeypatch,
                                                                       capsys):
    """Before: shutil.copy wrote the new run through a link at the executed copy's name, into the
    file it points to."""
    notebooks, executed = tmp_path / "notebooks", tmp_path / "executed"
    notebooks.mkdir()
    executed.mkdir()
    (notebooks / "01_a.ipynb").write_text(json.dumps(_small_notebook("x = 1")), encoding="utf-8")
    theirs = tmp_path / "thesis.ipynb"
    theirs.write_text("a person's file", encoding="utf-8")
    (executed / "01_a.ipynb").symlink_to(theirs)
    ran = _fake_runs(monkeypatch)
    with pytest.raises(SystemExit) as refused:
        build_site.ensure_executed(executed, notebooks)
    err = capsys.readouterr().err
    assert refused.value.code == 2 and f"{executed / '01_a.ipynb'} is a link" in err
    assert theirs.read_text(encoding="utf-8") == "a person's file" and ran == []


def test_a_copy_in_build_from_before_the_records_is_the_tools(tmp_path, monkeypatch):
    """build/executed as make test left it before the records existed is replaced (build/ is
    make's); the same copy anywhere else is refused."""
    monkeypatch.setattr(build_site, "ROOT", tmp_path)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    (notebooks / "01_a.ipynb").write_text(json.dumps(_small_notebook("x = 1")), encoding="utf-8")
    ran = _fake_runs(monkeypatch)
    old = json.dumps(_small_notebook("x = 0"))
    for executed in (tmp_path / "build" / "executed", tmp_path / "elsewhere"):
        executed.mkdir(parents=True)
        (executed / "01_a.ipynb").write_text(old, encoding="utf-8")
    build_site.ensure_executed(tmp_path / "build" / "executed", notebooks)
    assert ran == ["01_a.ipynb"]
    with pytest.raises(SystemExit):
        build_site.ensure_executed(tmp_path / "elsewhere", notebooks)
    assert (tmp_path / "elsewhere" / "01_a.ipynb").read_text(encoding="utf-8") == old


def test_a_refused_out_exits_2_with_one_line_before_anything_is_built(tmp_path) -> None:
    """Bad input is exit 2 and one line, as every command of the course (a failed run is 1)."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("a user's file")
    tool = str(ROOT / "tools" / "build_site.py")
    run = subprocess.run([sys.executable, tool, "--out", str(mine)], capture_output=True,
                         text=True, cwd=tmp_path, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stderr.count("\n") == 1 and "is not a site this tool built" in run.stderr, run.stderr
    assert (mine / "notes.txt").read_text() == "a user's file"
