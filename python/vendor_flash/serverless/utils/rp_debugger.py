"""``runpod.serverless.utils.rp_debugger``: time steps of a handler.

>>> from vendor_flash.serverless.utils import rp_debugger
>>> @rp_debugger.FunctionTimer
... def predict(job): ...
>>> with rp_debugger.LineTimer("download_step"):
...     pass

The timings are kept per process until :func:`get_debugger_output` (which also clears them) or
:func:`clear_debugger_output`. With ``--rp_debugger`` on the command line, the worker adds them
to a job's output as ``output["rp_debugger"]`` (dict outputs only), as runpod-python does, and
clears them after every job either way.
"""

from __future__ import annotations

import datetime
import functools
import inspect
import platform
import threading
import time
from typing import Any, Callable, Dict, List, Optional

_lock = threading.Lock()
_checkpoints: List[Dict[str, Any]] = []


def _now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class Checkpoints:
    """The process's list of timed steps: ``add(name)``, ``start(name)``, ``stop(name)``.

    Every instance shares one list. A name may be timed again (a handler run for each job).
    """

    def add(self, name: str) -> None:
        with _lock:
            _checkpoints.append({"name": name})

    def _latest(self, name: str) -> Dict[str, Any]:
        for checkpoint in reversed(_checkpoints):
            if checkpoint["name"] == name:
                return checkpoint
        raise KeyError(f"Checkpoint name '{name}' does not exist.")

    def start(self, name: str) -> None:
        with _lock:
            checkpoint = self._latest(name)
            checkpoint["start"] = _now_iso()
            checkpoint["_t0"] = time.perf_counter()

    def stop(self, name: str) -> None:
        with _lock:
            checkpoint = self._latest(name)
            if "_t0" not in checkpoint:
                raise KeyError("Checkpoint has not been started.")
            checkpoint["end"] = _now_iso()
            checkpoint["duration_ms"] = (time.perf_counter() - checkpoint.pop("_t0")) * 1000

    def get_checkpoints(self) -> List[Dict[str, Any]]:
        """The finished steps: ``{"name", "start", "end", "duration_ms"}`` each, in start order."""
        with _lock:
            return [dict(c) for c in _checkpoints if "duration_ms" in c]

    def clear(self) -> None:
        with _lock:
            _checkpoints.clear()


class LineTimer:
    """``with LineTimer("step"):`` records how long the block took."""

    def __init__(self, name: str):
        self.name = name
        self.checkpoints = Checkpoints()
        self.checkpoints.add(name)

    def __enter__(self) -> "LineTimer":
        self.checkpoints.start(self.name)
        return self

    def __exit__(self, *exc_info) -> None:
        self.checkpoints.stop(self.name)


class FunctionTimer:
    """Decorator recording each call's duration under the function's name (sync or async)."""

    def __init__(self, function: Callable):
        self.function = function
        self.checkpoints = Checkpoints()
        functools.update_wrapper(self, function)
        if inspect.iscoroutinefunction(function):
            async def timed(*args, **kwargs):
                self.checkpoints.add(function.__name__)
                self.checkpoints.start(function.__name__)
                try:
                    return await function(*args, **kwargs)
                finally:
                    self.checkpoints.stop(function.__name__)
            self._call = timed
        else:
            self._call = None

    def __call__(self, *args, **kwargs):
        if self._call is not None:
            return self._call(*args, **kwargs)
        self.checkpoints.add(self.function.__name__)
        self.checkpoints.start(self.function.__name__)
        try:
            return self.function(*args, **kwargs)
        finally:
            self.checkpoints.stop(self.function.__name__)

    def __get__(self, instance, owner=None):  # as a method decorator
        return self if instance is None else functools.partial(self.__call__, instance)


def _system_info() -> Dict[str, Any]:
    return {"os": platform.system(), "os_version": platform.release(), "python_version": platform.python_version(),
            "machine": platform.machine()}


def get_debugger_output(ready_delay_ms: Optional[float] = None) -> Dict[str, Any]:
    """``{"system_info": {...}, "timestamps": [finished steps]}``, then clear the steps."""
    checkpoints = Checkpoints()
    output: Dict[str, Any] = {"system_info": _system_info(), "timestamps": checkpoints.get_checkpoints()}
    checkpoints.clear()
    if ready_delay_ms is not None:
        output["ready_delay_ms"] = ready_delay_ms
    return output


def clear_debugger_output() -> None:
    Checkpoints().clear()


def attach_debugger_output(body: Dict[str, Any], ready_delay_ms: Optional[float]) -> None:
    """For ``--rp_debugger``: add :func:`get_debugger_output` to a job-done body's dict
    ``output`` as ``rp_debugger``. Any other output (none, a list, an error) is left alone and
    the timings are cleared (runpod-python fails the post there)."""
    output = body.get("output")
    if isinstance(output, dict):
        output["rp_debugger"] = get_debugger_output(ready_delay_ms)
    else:
        clear_debugger_output()
