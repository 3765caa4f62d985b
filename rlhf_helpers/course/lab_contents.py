"""Open the course's notebooks in JupyterLab without marking them modified.

When a kernel connects, JupyterLab writes the kernel's `kernelspec` and `language_info` (which holds
the exact Python version, e.g. "3.11.7") into the notebook's metadata. Stored notebooks cannot hold
every learner's Python version, so that write differs from the stored metadata, and a notebook shows
as modified (●) before anything ran: closing it asks "save changes?" for nothing.

This contents manager hands JupyterLab each notebook with those two entries already as this
server's python3 kernel will report them; when the kernel connects, nothing changes. The file on
disk is only rewritten when the learner saves. `make lab` starts JupyterLab with it:

    jupyter lab notebooks/ \
        --ServerApp.contents_manager_class=rlhf_helpers.course.lab_contents.CourseContentsManager
"""

from __future__ import annotations

from typing import Any

from ipykernel.ipkernel import IPythonKernel
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager

KERNEL_NAME = "python3"  #: the kernel every course notebook names in its stored kernelspec


def kernel_metadata(display_name: str) -> dict[str, Any]:
    """The `kernelspec` and `language_info` JupyterLab will write when this Python's ipykernel
    connects."""
    return {"kernelspec": {"name": KERNEL_NAME, "display_name": display_name, "language": "python"},
            "language_info": dict(IPythonKernel.language_info)}


class CourseContentsManager(AsyncLargeFileManager):
    """jupyter_server's default contents manager, except that a python3 notebook is read with the
    metadata its kernel will report (see the module docstring)."""

    async def get(self, path: str, content: bool = True, type: str | None = None,  # noqa: A002 (the API's name)
                  format: str | None = None, **kwargs: Any) -> dict[str, Any]:  # noqa: A002
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        notebook = model.get("content") if model.get("type") == "notebook" else None
        if notebook is None or notebook.metadata.get("kernelspec", {}).get("name") != KERNEL_NAME:
            return model
        display_name = self._display_name()
        if display_name is not None:
            notebook.metadata.update(kernel_metadata(display_name))
        return model

    def _display_name(self) -> str | None:
        """The name this server's kernel specs give "python3"; None where it has no such spec (the
        notebook then opens as stored)."""
        specs = getattr(self.parent, "kernel_spec_manager", None)
        if specs is None:
            return None
        try:
            return specs.get_kernel_spec(KERNEL_NAME).display_name
        except Exception:  # noqa: BLE001 (jupyter_client raises NoSuchKernel, or an OSError on a broken spec)
            return None
