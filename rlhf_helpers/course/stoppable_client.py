"""The notebook client of `make course` and the notebook tests: Ctrl-C stops a notebook at once and
quietly, and the caller can tell it from a notebook that failed.

    client = StoppableClient(nb, timeout=600, kernel_name="python3")
    try:
        client.execute()
    except Exception:
        if client.interrupted:      # Ctrl-C came: stop, as on any Ctrl-C
            raise KeyboardInterrupt from None
        raise

nbclient's own Ctrl-C handler asks the kernel to shut down while its cell runs: the kernel prints a
zmq traceback, the cell ends in an AssertionError (and a "Task exception was never retrieved"
traceback at exit), and nothing says that Ctrl-C caused it. This client kills the kernel's process
group instead; nbclient sees the kernel dead within a second (DeadKernelError) and cleans up as
after any dead kernel, and `interrupted` records the Ctrl-C.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import signal
from typing import Any

from nbclient import NotebookClient

#: nbclient's log after Ctrl-C: its "kernel died" lines would only repeat what the caller says
_SILENT = logging.getLogger(__name__ + ".after_ctrl_c")
_SILENT.addHandler(logging.NullHandler())
_SILENT.propagate = False


class StoppableClient(NotebookClient):
    """A NotebookClient whose kernel Ctrl-C (SIGINT) kills; `interrupted` says it came."""

    interrupted: bool = False

    async def async_start_new_kernel(self, **kwargs: Any) -> None:
        """Start the kernel, Ctrl-C handled by `_stop` from now on. nbclient has just put its own
        handler on the event loop (a graceful shutdown); this one replaces it, and nbclient
        removes it when the notebook ends."""
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, self._stop)
        except (RuntimeError, NotImplementedError):  # not the main thread; Windows
            pass
        await super().async_start_new_kernel(**kwargs)
        if self.interrupted:  # Ctrl-C while the kernel started: it was not there to kill
            await self._kill_kernel()

    async def async_start_new_kernel_client(self) -> Any:
        """Connect to the kernel. A kernel killed on Ctrl-C before it answered: nbclient cleans
        up, but leaves its exit hook, which would fail on the kernel it no longer has."""
        try:
            return await super().async_start_new_kernel_client()
        except Exception:
            if self.interrupted:
                atexit.unregister(self._cleanup_kernel)
            raise

    def _stop(self) -> None:
        """Ctrl-C: note it and kill the kernel, and whatever it started, without a word."""
        if self.interrupted:
            return
        self.interrupted = True
        self.log = _SILENT
        self._kill = asyncio.ensure_future(self._kill_kernel())  # held: a task is weakly referenced

    async def _kill_kernel(self) -> None:
        """SIGKILL to the kernel's process group, if it runs (a kernel still starting is killed
        once started, by `async_start_new_kernel`)."""
        try:
            if self.km is not None and self.km.has_kernel:
                await self.km.signal_kernel(signal.SIGKILL)
        except (RuntimeError, OSError):  # gone meanwhile: nothing left to kill
            pass
