"""Headless tests of the explorers: build each one, set its controls from Python, and check the
figure's data against closed forms and loops written here (NumPy, not the maths core), on every
backend; bad input must show a message in the widget, never raise. The "html" backend's messages
are checked in a real kernel (one display, then updates of that same display id).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys

import numpy as np
import plotly.graph_objects as go
import pytest
import torch
from plotly.basedatatypes import Undefined
from plotly.offline import get_plotlyjs_version

from rlhf_helpers import widgets
from rlhf_helpers.widgets import backends, html_figure
from rlhf_helpers.widgets import clip_explorer as clip_mod
from rlhf_helpers.widgets import gae_explorer as gae_mod
from rlhf_helpers.widgets import kl_explorer as kl_mod
from rlhf_helpers.widgets import value_clip_explorer as vc_mod

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    torch.manual_seed(0)
    monkeypatch.delenv(widgets.ENV_VAR, raising=False)


@pytest.fixture(params=list(widgets.BACKENDS))
def backend(request) -> str:
    return request.param


_SHARED: dict[tuple[type, str], object] = {}


def shared(cls: type, backend: str):
    """One explorer per (class, backend) for the tests that set every control they read."""
    if (cls, backend) not in _SHARED:
        _SHARED[cls, backend] = cls(backend=backend)
    return _SHARED[cls, backend]


def _trace(explorer, index: int) -> tuple[np.ndarray, np.ndarray]:
    data = explorer.view.figure.data[index]
    return np.asarray(data.x, dtype=float), np.asarray(data.y, dtype=float)


def _grey_regions(explorer) -> list[tuple[float, float]]:
    """The shaded zero-gradient runs (grey rectangles) of a figure, as (x0, x1)."""
    return [(s.x0, s.x1) for s in explorer.view.figure.layout.shapes
            if "120,120,120" in s.fillcolor]


def _status_text(explorer) -> str:
    return re.sub(r"<[^>]+>", " ", explorer.status.value)


# ---------------------------------------------------------------------------------------- backends
def test_backend_precedence_argument_then_env_var_then_auto(monkeypatch) -> None:
    monkeypatch.setenv(widgets.ENV_VAR, "output")
    assert widgets.resolve_backend("figurewidget") == "figurewidget"  # the argument wins
    assert widgets.resolve_backend("auto") == "output"  # then the environment variable
    monkeypatch.setenv(widgets.ENV_VAR, "FigureWidget ")
    assert widgets.resolve_backend() == "figurewidget"
    monkeypatch.setenv(widgets.ENV_VAR, "HTML")
    assert widgets.resolve_backend() == "html"
    assert widgets.resolve_backend("output") == "output"
    monkeypatch.setenv(widgets.ENV_VAR, "plotly")
    with pytest.raises(ValueError, match=widgets.ENV_VAR):
        widgets.resolve_backend()
    with pytest.raises(ValueError, match="backend"):
        widgets.resolve_backend("svg")


def test_auto_backend_is_html_in_colab_or_without_figurewidget(monkeypatch) -> None:
    assert widgets.resolve_backend() == "figurewidget"  # anywidget is installed here
    monkeypatch.setitem(sys.modules, "google.colab", object())
    assert widgets.resolve_backend() == "html"
    explorer = widgets.KLExplorer()
    assert explorer.backend == "html" and not explorer.view.with_plotly_mime  # Colab: HTML alone
    monkeypatch.delitem(sys.modules, "google.colab")

    def broken(*args, **kwargs):
        raise ImportError("anywidget is not installed")

    monkeypatch.setattr(go, "FigureWidget", broken)
    assert backends.figurewidget_problem() == "ImportError: anywidget is not installed"
    assert widgets.resolve_backend() == "html"
    assert widgets.ClipExplorer().backend == "html"


def test_backends_hold_the_expected_figure_types(backend) -> None:
    explorer = widgets.ClipExplorer(backend=backend)
    if backend == "figurewidget":
        assert isinstance(explorer.view.figure, go.FigureWidget)
        assert explorer.view.widget is explorer.view.figure
    else:
        assert type(explorer.view.figure) is go.Figure
        # "html": the figure is a cell output of its own, not a widget in the explorer's box
        assert (explorer.view.widget is None) == (backend == "html")
        redraws = explorer.view.redraws
        explorer.set(eps=0.3)
        assert explorer.view.redraws == redraws + 1  # one redraw per update, not per control


def test_figurewidget_update_is_one_message_and_never_drops_x(monkeypatch) -> None:
    """One update = one plotly_update message; a trace whose x is not re-sent must not get an
    "undefined" x in it (plotly.js then plots that trace against its point index)."""
    explorer = widgets.ClipExplorer(backend="figurewidget")
    messages = []
    explorer.view.figure.observe(lambda change: change["new"] and messages.append(change["new"]),
                                 names="_py2js_update")
    explorer.set(advantage=-0.5, ratio=0.6)
    assert len(messages) == 1
    style = messages[0]["style_data"]
    assert {"x", "y"} <= set(style)  # the curves' y and the marker's x and y, together
    for prop, per_trace in style.items():
        assert not any(value is Undefined for value in per_trace), prop
    assert list(style["x"][clip_mod.OBJECTIVE]) == list(explorer.grid.tolist())


def _figure_in_html(html: str) -> dict:
    """The figure JSON embedded in an "html" bundle's script (`var fig = {...};`)."""
    line = next(line for line in html.splitlines() if line.strip().startswith("var fig = "))
    return json.loads(
        line.strip().removeprefix("var fig = ").removesuffix(";").replace("<\\/", "</"))


def test_html_bundle_holds_the_figure_a_loader_and_no_plotly_js() -> None:
    fig = go.Figure(go.Scatter(x=[0.0, 1.0, 2.0], y=[3.0, -1.0, 0.5], name="a </script> name"))
    fig.update_layout(width=640, height=300, title="t")
    bundle = html_figure.mime_bundle(fig)
    html = bundle["text/html"]
    embedded = _figure_in_html(html)
    assert embedded["data"][0]["name"] == "a </script> name"
    assert np.allclose(np.asarray(embedded["data"][0]["y"], dtype=float), [3.0, -1.0, 0.5])
    assert bundle[html_figure.PLOTLY_MIME] == embedded  # the same figure in both parts
    # one script element: a "</script>" in the data is escaped, so it cannot end the script early
    assert html.count("</script>") == 1 and html.count("<script") == 1
    assert f'"{html_figure.plotly_js_url()}"' in html  # loaded by the script, not pasted in
    assert len(html) < 10_000  # plotly.js itself (~4.6 MB) is not in it
    assert "width:640px;height:300px" in html  # the output keeps its size while plotly.js loads
    assert html_figure.plotly_js_url().endswith(f"plotly-{get_plotlyjs_version()}.min.js")
    assert set(html_figure.mime_bundle(fig, with_plotly_mime=False)) == {"text/html"}
    ids = {re.search(r'id="([^"]+)"', html_figure.mime_bundle(fig)["text/html"]).group(1)
           for _ in range(3)}
    assert len(ids) == 3  # a fresh element id per render: two outputs never share one


KERNEL_CODE = """
import json, sys, types
if COLAB:
    sys.modules["google.colab"] = types.ModuleType("google.colab")
from IPython.display import display
from rlhf_helpers import widgets
explorer = widgets.ClipExplorer()
print(json.dumps({"backend": explorer.backend}))
display(explorer)
explorer.set(advantage=-0.5)  # one update (several controls set) ...
explorer.controls["eps"].slider.value = 0.3  # ... and one slider move
"""


def _run_in_kernel(code: str) -> list[dict]:
    """Run `code` in a fresh python3 kernel; return its display/update/stream/error messages."""
    from jupyter_client.manager import start_new_kernel

    env = {k: v for k, v in os.environ.items() if k != widgets.ENV_VAR}
    km, kc = start_new_kernel(kernel_name="python3", env={**env, "OMP_NUM_THREADS": "1"})
    messages: list[dict] = []
    try:
        kc.execute_interactive(code, timeout=120, output_hook=messages.append)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    errors = ["\n".join(m["content"]["traceback"]) for m in messages if m["msg_type"] == "error"]
    assert not errors, errors[0]
    return messages


@pytest.mark.parametrize("colab", [False, True], ids=["jupyter", "colab"])
def test_html_backend_displays_once_then_updates_that_display_in_place(colab) -> None:
    messages = _run_in_kernel(f"COLAB = {colab}\n{KERNEL_CODE}")
    printed = json.loads(next(m for m in messages if m["msg_type"] == "stream")["content"]["text"])
    assert printed["backend"] == ("html" if colab else "figurewidget")  # auto
    if not colab:  # outside Colab "auto" is FigureWidget: run again with "html" named
        messages = _run_in_kernel(f"COLAB = False\n{KERNEL_CODE}".replace(
            "ClipExplorer()", 'ClipExplorer(backend="html")'))
    shown = [m for m in messages if m["msg_type"] == "display_data"]
    updates = [m for m in messages if m["msg_type"] == "update_display_data"]
    assert len(shown) == 2, "one display for the controls and one for the figure, nothing stacked"
    # controls first
    assert "application/vnd.jupyter.widget-view+json" in shown[0]["content"]["data"]
    figure = shown[1]["content"]
    display_id = figure["transient"]["display_id"]
    expected = {"text/html"} if colab else {"text/html", html_figure.PLOTLY_MIME}
    assert set(figure["data"]) == expected
    assert "A = +1" in _figure_in_html(figure["data"]["text/html"])["layout"]["title"]["text"]
    # two updates, both of that same display id, HTML alone, each with the state it was sent for
    assert [m["content"]["transient"]["display_id"] for m in updates] == [display_id, display_id]
    assert all(set(m["content"]["data"]) == {"text/html"} for m in updates)
    titles = [_figure_in_html(m["content"]["data"]["text/html"])["layout"]["title"]["text"]
              for m in updates]
    assert "ε = 0.2, A = -0.5" in titles[0] and "ε = 0.3, A = -0.5" in titles[1]


# ------------------------------------------------------------------------------------ clip explorer
def clip_reference(r: np.ndarray, eps: float, adv: float, dual: float | None):
    """min(rA, clip(r, 1-eps, 1+eps)A) (dual clip: max(that, cA) for A < 0) and d/dr by cases."""
    unclipped = r * adv
    clipped = np.clip(r, 1 - eps, 1 + eps) * adv
    objective = np.minimum(unclipped, clipped)
    # gradient A where the unclipped term is chosen (inside the band both terms are rA), else 0
    inside = (r > 1 - eps) & (r < 1 + eps)
    gradient = np.where(inside | (unclipped < clipped), adv, 0.0)
    if dual is not None and adv < 0:
        floor = dual * adv
        gradient = np.where(objective < floor, 0.0, gradient)
        objective = np.maximum(objective, floor)
    return unclipped, clipped, objective, gradient


def _away_from_kinks(r: np.ndarray, kinks: list[float]) -> np.ndarray:
    return np.all([np.abs(r - k) > 1e-6 for k in kinks], axis=0)


@pytest.mark.parametrize(("eps", "adv", "dual"),
                         [(0.2, 1.0, None), (0.1, -1.5, None), (0.3, 0.7, None),
                          (0.2, -1.0, 2.0), (0.25, 1.2, 2.5)])
def test_clip_explorer_curves_match_the_closed_form(backend, eps, adv, dual) -> None:
    explorer = shared(widgets.ClipExplorer, backend)
    explorer.set(eps=eps, advantage=adv, dual=dual is not None, dual_clip=dual or 2.0)
    assert explorer.error is None
    r, y_obj = _trace(explorer, clip_mod.OBJECTIVE)
    assert r[0] == 0.0 and r[-1] == 3.0 and len(r) == 601
    unclipped, clipped, objective, gradient = clip_reference(r, eps, adv, dual)
    np.testing.assert_allclose(_trace(explorer, clip_mod.UNCLIPPED)[1], unclipped, atol=1e-12)
    np.testing.assert_allclose(_trace(explorer, clip_mod.CLIPPED)[1], clipped, atol=1e-12)
    np.testing.assert_allclose(y_obj, objective, atol=1e-12)
    smooth = _away_from_kinks(r, [1 - eps, 1 + eps] + ([dual] if dual else []))
    r_grad, y_grad = _trace(explorer, clip_mod.GRADIENT)
    np.testing.assert_array_equal(r_grad, r)
    np.testing.assert_allclose(y_grad[smooth], gradient[smooth], atol=1e-12)
    # the x of every curve is the ratio grid (not the point index)
    for index in (clip_mod.UNCLIPPED, clip_mod.CLIPPED):
        np.testing.assert_array_equal(_trace(explorer, index)[0], r)


def test_clip_explorer_marker_and_case_at_a_few_ratios(backend) -> None:
    eps = 0.2
    explorer = widgets.ClipExplorer(backend=backend, eps=eps)
    for ratio in (0.5, 0.95, 1.0, 1.15, 1.6, 2.7):
        for adv in (1.0, -1.0):
            explorer.set(ratio=ratio, advantage=adv)
            x, y = _trace(explorer, clip_mod.CURRENT)
            assert x.tolist() == [ratio]
            assert y[0] == pytest.approx(
                min(ratio * adv, min(max(ratio, 1 - eps), 1 + eps) * adv), abs=1e-12)
            region = 0 if ratio < 1 - eps else 2 if ratio > 1 + eps else 1
            case = (1 + region) if adv > 0 else (4 + region)  # cases 1-3 for A > 0, 4-6 for A < 0
            status = _status_text(explorer)
            assert f"case {case} " in status, status
            no_gradient = (adv > 0 and ratio > 1 + eps) or (adv < 0 and ratio < 1 - eps)
            assert ("gradient 0" in status) == no_gradient


def test_clip_explorer_shades_exactly_the_zero_gradient_regions(backend) -> None:
    explorer = widgets.ClipExplorer(backend=backend)
    step = 3.0 / 600
    explorer.set(eps=0.2, advantage=1.0)  # A > 0: no gradient above 1 + eps (case 3)
    [(x0, x1)] = _grey_regions(explorer)
    assert x0 == pytest.approx(1.2, abs=1.5 * step) and x1 == 3.0
    labels = [a.text for a in explorer.view.figure.layout.annotations]
    assert sum(text.startswith("case ") for text in labels) == 3
    assert {t.split("<br>")[0] for t in labels if t.startswith("case")} == {"case 1",
                                                                            "case 2", "case 3"}

    explorer.set(advantage=-0.8)  # A < 0: no gradient below 1 - eps (case 4)
    [(x0, x1)] = _grey_regions(explorer)
    assert x0 == 0.0 and x1 == pytest.approx(0.8, abs=1.5 * step)
    labels = [a.text for a in explorer.view.figure.layout.annotations]
    assert {t.split("<br>")[0] for t in labels if t.startswith("case")} == {"case 4",
                                                                            "case 5", "case 6"}

    explorer.set(dual=True, dual_clip=2.0)  # and, with the dual clip, above c
    regions = sorted(_grey_regions(explorer))
    assert len(regions) == 2
    assert regions[1][0] == pytest.approx(2.0, abs=1.5 * step) and regions[1][1] == 3.0
    assert any("dual clip" in a.text for a in explorer.view.figure.layout.annotations)

    explorer.set(advantage=0.0)  # no learning signal anywhere
    assert _grey_regions(explorer) == [(0.0, 3.0)]
    assert "A = 0" in _status_text(explorer)


def test_clip_explorer_batch_histogram_and_clip_fraction(backend) -> None:
    gen = torch.Generator().manual_seed(1)
    ratios = torch.exp(0.25 * torch.randn(500, generator=gen, dtype=torch.float64))  # (500,)
    explorer = widgets.ClipExplorer(ratios=ratios.view(20, 25), backend=backend,
                                    eps=0.2, advantage=1.0)
    hist = explorer.view.figure.data[clip_mod.HISTOGRAM]
    assert hist.visible is True
    np.testing.assert_allclose(np.asarray(hist.x, dtype=float), ratios.numpy())
    r = ratios.numpy()
    for adv, cut in ((1.0, r > 1.2), (-1.0, r < 0.8)):  # A > 0 is cut above, A < 0 below the band
        explorer.set(advantage=adv)
        assert f"clipfrac {cut.mean():.1%}" in _status_text(explorer)
        assert f"approx_kl {np.mean(r - 1 - np.log(r)):.4f}" in _status_text(explorer)
    figure = widgets.ClipExplorer(backend=backend).view.figure
    assert figure.data[clip_mod.HISTOGRAM].visible is False


CLIP_BAD_INPUT = [({"eps": 0.0}, "clip_eps"), ({"eps": -0.1}, "clip_eps"),
                  ({"ratio": 0.0}, "ratio"),
                  ({"ratio": -1.0}, "ratio"), ({"dual": True, "dual_clip": 0.5}, "dual_clip"),
                  ({"eps": float("nan")}, "clip_eps")]


def test_clip_explorer_bad_input_shows_a_message(backend) -> None:
    explorer = widgets.ClipExplorer(backend=backend)
    before = _trace(explorer, clip_mod.OBJECTIVE)[1].copy()
    for bad, name in CLIP_BAD_INPUT:
        updates = explorer.updates
        explorer.set(**bad)  # must not raise
        assert explorer.error is not None and name in explorer.error, (bad, explorer.error)
        assert "&#9888;" in explorer.status.value and "last valid values" in explorer.status.value
        np.testing.assert_array_equal(_trace(explorer, clip_mod.OBJECTIVE)[1], before)  # untouched
        assert explorer.updates == updates
        explorer.set(eps=0.2, ratio=1.3, dual=False)  # a good value clears the message
        assert explorer.error is None and "&#9888;" not in explorer.status.value


def test_clip_explorer_typed_value_reaches_the_maths_even_outside_the_slider(backend) -> None:
    explorer = widgets.ClipExplorer(backend=backend)
    # typed into the box: the slider stops at its min (0.01)
    explorer.controls["eps"].text.value = 0.0
    assert explorer.controls["eps"].slider.value == explorer.controls["eps"].slider.min == 0.01
    assert "clip_eps" in explorer.error
    explorer.controls["eps"].slider.value = 0.3  # dragging updates the box and the figure
    assert explorer.controls["eps"].value == 0.3 and explorer.error is None
    assert "ε = 0.3" in explorer.view.figure.layout.title.text


def test_clip_explorer_rejects_bad_construction_arguments() -> None:
    with pytest.raises(ValueError, match="ratios"):
        widgets.ClipExplorer(ratios=[1.0, float("nan")], backend="output")
    with pytest.raises(ValueError, match="ratios"):
        widgets.ClipExplorer(ratios=[], backend="output")
    with pytest.raises(ValueError, match="ratio_range"):
        widgets.ClipExplorer(ratio_range=(1.2, 3.0), backend="output")
    with pytest.raises(ValueError, match="unknown control"):
        widgets.ClipExplorer(backend="output").set(epsilon=0.1)


# ------------------------------------------------------------------------------------- GAE explorer
def gae_loop(response: widgets.TokenResponse, gamma: float, lam: float, beta: float, score: float,
             kind: str = "k1") -> dict[str, np.ndarray]:
    """Rewards, TD errors, advantages, returns and Monte-Carlo returns by plain loops."""
    lp, ref, values = (np.asarray(getattr(response, n), dtype=float)
                       for n in ("logprobs", "ref_logprobs", "values"))
    T = len(lp)
    log_ratio = lp - ref
    kl = {"k1": log_ratio, "k2": 0.5 * log_ratio**2, "k3": np.exp(-log_ratio) - 1 + log_ratio}[kind]
    rewards = -beta * kl
    rewards[-1] += score
    deltas, advantages, mc = np.zeros(T), np.zeros(T), np.zeros(T)
    next_value, running, g = 0.0, 0.0, 0.0  # V after the last token is 0
    for t in reversed(range(T)):
        deltas[t] = rewards[t] + gamma * next_value - values[t]
        running = deltas[t] + gamma * lam * running
        advantages[t] = running
        g = rewards[t] + gamma * g
        mc[t] = g
        next_value = values[t]
    return {"kl": kl, "rewards": rewards, "deltas": deltas, "advantages": advantages,
            "returns": advantages + values, "mc": mc, "values": values}


def _gae_series(explorer) -> dict[str, np.ndarray]:
    names = {"penalty": gae_mod.KL_PART, "score": gae_mod.SCORE_PART, "rewards": gae_mod.REWARD,
             "deltas": gae_mod.TD, "advantages": gae_mod.ADVANTAGE, "whitened": gae_mod.WHITENED,
             "returns": gae_mod.RETURN, "mc": gae_mod.MC_RETURN, "values": gae_mod.VALUE}
    return {name: _trace(explorer, index)[1] for name, index in names.items()}


@pytest.mark.parametrize(("gamma", "lam", "beta", "score", "kind"),
                         [(1.0, 0.95, 0.1, 1.6, "k1"), (0.9, 0.5, 0.3, -1.0, "k3"),
                          (0.99, 0.8, 0.05, 2.0, "k2")])
def test_gae_explorer_matches_the_loop(backend, gamma, lam, beta, score, kind) -> None:
    explorer = shared(widgets.GAEExplorer, backend)
    explorer.set(gamma=gamma, lam=lam, kl_coef=beta, score=score, kl_kind=kind)
    ref = gae_loop(explorer.response, gamma, lam, beta, score, kind)
    s = _gae_series(explorer)
    np.testing.assert_allclose(s["penalty"], -beta * ref["kl"], atol=1e-12)
    # score on the last token
    np.testing.assert_allclose(s["score"], [0.0] * 9 + [score], atol=1e-12)
    for name in ("rewards", "deltas", "advantages", "returns", "mc", "values"):
        np.testing.assert_allclose(s[name], ref[name], atol=1e-10, err_msg=name)
    # whitened: (A - mean) / sqrt(unbiased var + 1e-8): mean 0, sd just under 1, increasing in A
    white = s["whitened"]
    var = s["advantages"].var(ddof=1)
    np.testing.assert_allclose(white, (s["advantages"] - s["advantages"].mean())
                               / np.sqrt(var + 1e-8), atol=1e-10)
    assert white.mean() == pytest.approx(0.0, abs=1e-9)
    assert white.std(ddof=1) == pytest.approx(1.0, abs=1e-5)
    assert np.corrcoef(white, s["advantages"])[0, 1] == pytest.approx(1.0, abs=1e-9)
    tokens = explorer.view.figure.layout.xaxis3.ticktext
    assert [t.split("<br>")[1] for t in tokens] == [tok.strip() for tok in explorer.response.tokens]


def test_gae_lambda_zero_is_td_and_lambda_one_is_monte_carlo(backend) -> None:
    explorer = widgets.GAEExplorer(backend=backend, gamma=0.95, kl_coef=0.2)
    r = explorer.response
    lp, ref, values = (np.asarray(getattr(r, n)) for n in ("logprobs", "ref_logprobs", "values"))
    rewards = -0.2 * (lp - ref)
    rewards[-1] += r.score

    explorer.set(lam=0.0)  # one-step TD: A_t = r_t + gamma V_{t+1} - V_t
    td = [rewards[t] + 0.95 * (values[t + 1] if t + 1 < len(values) else 0.0) - values[t]
          for t in range(len(values))]
    s = _gae_series(explorer)
    np.testing.assert_allclose(s["advantages"], td, atol=1e-12)
    np.testing.assert_allclose(s["deltas"], td, atol=1e-12)
    assert "λ = 0 is one-step TD" in _status_text(explorer)

    explorer.set(lam=1.0, gamma=1.0)  # Monte-Carlo: A_t = sum_{l >= t} r_l - V_t
    mc = np.array([rewards[t:].sum() for t in range(len(rewards))])
    s = _gae_series(explorer)
    np.testing.assert_allclose(s["advantages"], mc - values, atol=1e-12)
    np.testing.assert_allclose(s["returns"], mc, atol=1e-12)
    np.testing.assert_allclose(s["mc"], mc, atol=1e-12)
    assert "λ = 1 is Monte-Carlo" in _status_text(explorer)


def test_gae_explorer_on_a_custom_response(backend) -> None:
    response = widgets.TokenResponse(tokens=["a", "b", "c"], logprobs=[-1.0, -0.5, -2.0],
                                     ref_logprobs=[-1.5, -0.5, -1.0],
                                     values=[0.1, 0.2, 0.4], score=0.7)
    explorer = widgets.GAEExplorer(response=response, backend=backend, gamma=0.9,
                                   lam=0.7, kl_coef=0.5)
    ref = gae_loop(response, 0.9, 0.7, 0.5, 0.7)
    np.testing.assert_allclose(_gae_series(explorer)["advantages"], ref["advantages"], atol=1e-12)
    with pytest.raises(ValueError, match="values"):
        widgets.GAEExplorer(response=widgets.TokenResponse(tokens=["a", "b"], logprobs=[0, 0],
                                                           ref_logprobs=[0, 0], values=[0.0]))


def test_gae_explorer_bad_input_shows_a_message(backend) -> None:
    explorer = widgets.GAEExplorer(backend=backend)
    before = _gae_series(explorer)["advantages"].copy()
    for bad, name in [({"lam": 1.5}, "lam"), ({"lam": -0.2}, "lam"), ({"gamma": 1.01}, "gamma"),
                      ({"kl_coef": -0.1}, "kl_coef"), ({"score": float("inf")}, "score")]:
        explorer.set(**bad)  # a value typed into the text box, beyond the slider
        assert explorer.error is not None and name in explorer.error, (bad, explorer.error)
        assert "&#9888;" in explorer.status.value
        np.testing.assert_array_equal(_gae_series(explorer)["advantages"], before)
        explorer.set(lam=0.95, gamma=1.0, kl_coef=0.1, score=1.6)
        assert explorer.error is None


# -------------------------------------------------------------------------------------- KL explorer
def test_kl_explorer_curves_are_the_three_estimators(backend) -> None:
    explorer = widgets.KLExplorer(backend=backend)
    x, k1 = _trace(explorer, explorer.curve)
    np.testing.assert_allclose(k1, x, atol=1e-12)  # k1 = log pi - log ref
    np.testing.assert_allclose(_trace(explorer, explorer.curve + 1)[1], 0.5 * x**2, atol=1e-12)
    np.testing.assert_allclose(_trace(explorer, explorer.curve + 2)[1],
                               np.exp(-x) - 1 + x, atol=1e-12)
    # the sampled tokens sit on the curves
    lr, s1 = _trace(explorer, explorer.sampled)
    assert len(lr) == 16
    np.testing.assert_allclose(s1, lr, atol=1e-12)
    np.testing.assert_allclose(_trace(explorer, explorer.sampled + 1)[1], 0.5 * lr**2, atol=1e-12)
    np.testing.assert_allclose(_trace(explorer, explorer.sampled + 2)[1],
                               np.exp(-lr) - 1 + lr, atol=1e-12)


@pytest.mark.parametrize("shift", [0.3, 1.0, 2.0])
def test_kl_explorer_means_and_spreads_against_the_exact_kl(backend, shift) -> None:
    n = 16
    explorer = widgets.KLExplorer(backend=backend, shift=shift, n_samples=n, repeats=400)
    log_pi, log_ref = (t.numpy() for t in kl_mod.categorical_pair(shift, explorer.vocab))
    pi = np.exp(log_pi)
    exact = float(np.sum(pi * (log_pi - log_ref)))  # KL(pi || ref) by hand
    np.testing.assert_allclose(explorer.view.figure.data[explorer.exact].y, [exact] * 3, rtol=1e-12)
    assert f"exact KL(π‖ref) = {exact:.4f}" in explorer.view.figure.layout.title.text

    log_ratio = log_pi - log_ref
    per_token = {"k1": log_ratio, "k2": 0.5 * log_ratio**2,
                 "k3": np.exp(-log_ratio) - 1 + log_ratio}
    for i, kind in enumerate(("k1", "k2", "k3")):
        means = np.asarray(explorer.view.figure.data[explorer.box + i].y, dtype=float)  # (R,)
        assert len(means) == 400
        expected = float(np.sum(pi * per_token[kind]))  # E_pi of the estimator
        sd = math.sqrt(float(np.sum(pi * (per_token[kind] - expected) ** 2)) / n)  # of a batch mean
        assert means.mean() == pytest.approx(expected, abs=4 * sd / math.sqrt(400))
        assert means.std(ddof=1) == pytest.approx(sd, rel=0.2)
        if kind != "k2":  # k1 and k3 are unbiased: their mean is the exact KL
            assert expected == pytest.approx(exact, rel=1e-9)
        else:
            assert kind == "k2" and expected != pytest.approx(exact, rel=1e-3)
        if kind != "k1":
            assert (means >= 0).all()
    # why k1 can be negative: ref likes some sampled tokens more than pi does
    assert (log_ratio < 0).any()
    k1_tokens = _trace(explorer, explorer.sampled)[1]
    assert (k1_tokens < 0).any() == bool(np.isin(np.round(k1_tokens, 12),
                                                  np.round(log_ratio[log_ratio < 0], 12)).any())
    assert "k1: mean" in _status_text(explorer)


def test_kl_explorer_identical_distributions_give_zero(backend) -> None:
    explorer = widgets.KLExplorer(backend=backend, shift=0.0)
    for i in range(3):
        np.testing.assert_allclose(explorer.view.figure.data[explorer.box + i].y, 0.0, atol=1e-12)
    assert explorer.view.figure.data[explorer.exact].y[0] == pytest.approx(0.0, abs=1e-12)


def test_kl_explorer_bad_input_shows_a_message(backend) -> None:
    explorer = widgets.KLExplorer(backend=backend)
    for bad, name in [({"n_samples": 0}, "n_samples"), ({"shift": -0.5}, "shift"),
                      ({"shift": float("nan")}, "shift")]:
        explorer.set(**bad)
        assert explorer.error is not None and name in explorer.error, (bad, explorer.error)
        assert "&#9888;" in explorer.status.value
        explorer.set(shift=1.0, n_samples=16)
        assert explorer.error is None


# ------------------------------------------------------------------------------- value-clip
# explorer
@pytest.mark.parametrize(("c", "old", "ret"), [(0.2, 0.0, 1.0), (0.5, 1.0, -0.5), (0.1, 0.3, 0.35)])
def test_value_clip_explorer_matches_the_closed_form(backend, c, old, ret) -> None:
    explorer = shared(widgets.ValueClipExplorer, backend)
    explorer.set(value_clip=c, old_value=old, ret=ret, value=0.7)
    v, clipped = _trace(explorer, vc_mod.CLIPPED)
    err = (v - ret) ** 2
    err_clipped = (old + np.clip(v - old, -c, c) - ret) ** 2
    np.testing.assert_allclose(_trace(explorer, vc_mod.UNCLIPPED)[1], 0.5 * err, atol=1e-12)
    np.testing.assert_allclose(clipped, 0.5 * np.maximum(err, err_clipped), atol=1e-12)
    np.testing.assert_allclose(_trace(explorer, vc_mod.GRAD_UNCLIPPED)[1], v - ret, atol=1e-12)
    # the clipped branch (flat in V outside the band) wins -> no gradient
    grad = np.where(err_clipped > err, 0.0, v - ret)
    smooth = _away_from_kinks(v, [old - c, old + c, ret, 2 * ret - old - c, 2 * ret - old + c])
    np.testing.assert_allclose(_trace(explorer, vc_mod.GRAD_CLIPPED)[1][smooth],
                               grad[smooth], atol=1e-12)
    # the grey regions cover exactly the points where clipping removes the gradient
    zero = (grad == 0) & (v != ret)
    covered = np.zeros_like(zero)
    for x0, x1 in _grey_regions(explorer):
        covered |= (v >= x0 - 1e-12) & (v <= x1 + 1e-12)
    np.testing.assert_array_equal(covered[smooth], zero[smooth])
    x, y = _trace(explorer, vc_mod.CURRENT)
    expected = 0.5 * max((0.7 - ret) ** 2, (old + min(max(0.7 - old, -c), c) - ret) ** 2)
    assert x.tolist() == [0.7] and y[0] == pytest.approx(expected, abs=1e-12)


def test_value_clip_explorer_bad_input_shows_a_message(backend) -> None:
    explorer = widgets.ValueClipExplorer(backend=backend)
    for bad in (0.0, -0.2, float("nan")):
        explorer.set(value_clip=bad)
        assert explorer.error is not None and "value_clip" in explorer.error, explorer.error
        assert "&#9888;" in explorer.status.value
        explorer.set(value_clip=0.2)
        assert explorer.error is None


# ------------------------------------------------------------------------------------------- common
@pytest.mark.parametrize("cls", [widgets.ClipExplorer, widgets.GAEExplorer, widgets.KLExplorer,
                                 widgets.ValueClipExplorer])
def test_every_explorer_is_one_widget_with_a_status_line(backend, cls) -> None:
    import ipywidgets

    explorer = cls(backend=backend)
    assert isinstance(explorer.widget, ipywidgets.VBox)
    assert explorer.status in explorer.widget.children
    assert explorer.error is None and explorer.updates == 1
    assert explorer.continuous_update == (backend == "figurewidget")
    assert all(c.slider.continuous_update == explorer.continuous_update
               for c in explorer.controls.values() if hasattr(c, "slider"))
