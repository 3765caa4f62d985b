"""What every explorer shares: a slider paired with a text box, a status line, and the update loop
that turns a ValueError from the maths core into a message instead of a traceback.

Only ipywidgets APIs present in both 7.7 (Colab) and 8 are used: `observe`, `layout=`, `style=`,
`add_class`, FloatSlider/IntSlider/FloatText/IntText/Checkbox/Dropdown/HTML/HBox/VBox.
"""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as widgets
import torch
from IPython.display import display

from rlhf_helpers.runtime.figure_template import FIGURE_FONT  # noqa: F401 (the explorers import it from here)
from rlhf_helpers.widgets.backends import FigureView, resolve_backend

DESCRIPTION_STYLE = {"description_width": "120px"}  #: room for labels such as "KL coef β"
#: figure width in px: plotly's FigureWidget does not follow its container (it falls back to
#: 700 px), so every figure states one, wide enough for legible labels, narrow enough for Colab
FIGURE_WIDTH = 920


class NumberControl:
    """A slider for dragging and a text box for typing one number.

    The text box holds the value (`.value`) and accepts numbers outside the slider's range, so a
    typed-in bad value (lambda = 1.5, eps = -1) reaches the maths core and is reported by it.
    """

    def __init__(
        self,
        description: str,
        value: float,
        min: float,
        max: float,
        step: float,
        continuous_update: bool,
        css_class: str,
        integer: bool = False,
    ) -> None:
        slider_cls = widgets.IntSlider if integer else widgets.FloatSlider
        text_cls = widgets.IntText if integer else widgets.FloatText
        self.integer = integer
        self.slider = slider_cls(
            value=self._clamp(value, min, max),
            min=min,
            max=max,
            step=step,
            description=description,
            readout=False,
            continuous_update=continuous_update,
            style=DESCRIPTION_STYLE,
            layout=widgets.Layout(width="340px"),
        )
        self.text = text_cls(value=value, layout=widgets.Layout(width="90px"))
        self.box = widgets.HBox([self.slider, self.text])
        self.box.add_class(css_class)  # a stable handle for the browser test and for CSS
        self._syncing = False  # True while one half updates the other, to stop the echo
        self.slider.observe(self._from_slider, names="value")
        self.text.observe(self._from_text, names="value")

    @staticmethod
    def _clamp(value: float, lo: float, hi: float) -> float:
        return min(max(value, lo), hi)

    @property
    def value(self) -> float:
        return self.text.value

    @value.setter
    def value(self, new: float) -> None:
        self.text.value = new

    def observe(self, callback: Callable[[dict], None]) -> None:
        """Call `callback(change)` whenever the value changes (dragged or typed)."""
        self.text.observe(callback, names="value")

    def _from_slider(self, change: dict) -> None:
        if self._syncing:
            return
        self._syncing = True
        try:  # round away float steps such as 0.30000000000000004 before showing them
            self.text.value = change["new"] if self.integer else round(change["new"], 6)
        finally:
            self._syncing = False

    def _from_text(self, change: dict) -> None:
        if self._syncing:
            return
        self._syncing = True
        try:
            self.slider.value = self._clamp(change["new"], self.slider.min, self.slider.max)
        finally:
            self._syncing = False


def status_html(message: str, error: bool) -> str:
    """The status line: a message, red with a warning sign when it reports bad input."""
    text = html.escape(message).replace("\n", "<br>")
    if error:
        return f'<div style="color:#b00020"><b>&#9888; {text}</b></div>'
    return f'<div style="color:#333">{text}</div>'


class Explorer:
    """Base of the explorers: controls + figure views + status line, and one `update` for all.

    Subclasses fill `self.controls` (name -> NumberControl or a plain value widget) and
    `self.views`, then call `self._finish(layout_children)`. `_render()` recomputes everything from
    the controls and returns the status message; a ValueError it raises is shown in the status line
    instead.
    """

    def __init__(self, backend: str = "auto") -> None:
        self.backend = resolve_backend(backend)  #: "figurewidget", "html" or "output"
        # the FigureWidget backend redraws cheaply: update while dragging; the others send and
        # redraw the whole figure, so they wait until the slider is released
        self.continuous_update = self.backend == "figurewidget"
        self.controls: dict[str, NumberControl | widgets.ValueWidget] = {}
        self.views: list[FigureView] = []
        self.status = widgets.HTML(value="")
        self.status.add_class("rlhf-status")
        self.error: str | None = None  #: the last bad-input message, None after a good update
        self.updates = 0  #: number of successful updates (for tests and benchmarks)
        self._holding = False
        self.widget: widgets.Box | None = None

    def number(self, name: str, description: str, value: float, min: float, max: float, step: float,
               integer: bool = False) -> NumberControl:
        """Add a slider + text box control named `name` (also the CSS class rlhf-<name>)."""
        control = NumberControl(description, value, min, max, step, self.continuous_update,
                                f"rlhf-{name}", integer=integer)
        self.controls[name] = control
        return control

    def _finish(self, children: list[widgets.Widget]) -> None:
        for control in self.controls.values():
            control.observe(self.update)
        # an "html" figure has no widget (it is a cell output of its own, see _ipython_display_)
        self.widget = widgets.VBox([*(c for c in children if c is not None), self.status])
        self.widget.add_class("rlhf-explorer")
        self.update()

    def values(self) -> dict[str, object]:
        """The current value of every control, by name."""
        return {name: control.value for name, control in self.controls.items()}

    def set(self, **values: object) -> None:
        """Set several controls at once from Python, with one update at the end."""
        unknown = sorted(set(values) - set(self.controls))
        if unknown:
            raise ValueError(
                f"unknown control(s) {unknown}; this explorer has {sorted(self.controls)}")
        self._holding = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._holding = False
        self.update()

    def update(self, change: dict | None = None) -> None:
        """Recompute and redraw from the controls; show bad input as a message, not a traceback."""
        if self._holding:
            return
        threads = torch.get_num_threads()
        # the tensors here are tiny: intra-op threads only add overhead, and on a busy CPU
        # their hand-offs cost milliseconds per op, so compute on one thread and restore after
        torch.set_num_threads(1)
        try:
            message = self._render()
        except ValueError as err:
            self.error = str(err)
            self.status.value = status_html(
                f"{self.error} (figure shows the last valid values)", True)
            return
        finally:
            torch.set_num_threads(threads)
        self.error = None
        self.updates += 1
        self.status.value = status_html(message, False)

    def _render(self) -> str:
        raise NotImplementedError

    def _ipython_display_(self) -> None:
        """The controls (one widget box), then any figure shown as a cell output ("html")."""
        display(self.widget)
        for view in self.views:
            view.show()
