"""vendor-flash: worker SDK for flashd queue endpoints, compatible with runpod-python.

``import vendor_flash as runpod`` gives the familiar ``runpod.serverless.start(...)`` and
``runpod.serverless.progress_update(...)``. :func:`install_runpod_alias` goes one step further
and lets unchanged ``import runpod`` code load this package.
"""

from __future__ import annotations

import sys

from . import serverless
from .serverless.modules.rp_logger import RunPodLogger
from .version import __version__

__all__ = ["serverless", "RunPodLogger", "__version__", "install_runpod_alias", "RUNPOD_MODULES"]

#: The ``runpod`` module names :func:`install_runpod_alias` provides, and what they load.
RUNPOD_MODULES = {
    "runpod": "vendor_flash",
    "runpod.serverless": "vendor_flash.serverless",
    "runpod.serverless.utils": "vendor_flash.serverless.utils",
    "runpod.serverless.utils.rp_validator": "vendor_flash.serverless.utils.rp_validator",
    "runpod.serverless.utils.rp_download": "vendor_flash.serverless.utils.rp_download",
    "runpod.serverless.utils.rp_upload": "vendor_flash.serverless.utils.rp_upload",
    "runpod.serverless.utils.rp_cleanup": "vendor_flash.serverless.utils.rp_cleanup",
    "runpod.serverless.utils.rp_debugger": "vendor_flash.serverless.utils.rp_debugger",
    "runpod.serverless.modules": "vendor_flash.serverless.modules",
    "runpod.serverless.modules.rp_logger": "vendor_flash.serverless.modules.rp_logger",
}


def install_runpod_alias(force: bool = False) -> bool:
    """Register this package as ``runpod`` in ``sys.modules``, with the submodules listed in
    :data:`RUNPOD_MODULES` (``runpod.serverless``, ``runpod.serverless.utils.rp_validator``,
    ``rp_upload``, ``rp_download``, ``rp_cleanup``, ``rp_debugger``,
    ``runpod.serverless.modules.rp_logger``…).

    Does nothing when a real ``runpod`` is already imported, unless ``force``. Returns True when
    the alias was installed.
    """
    if "runpod" in sys.modules and not force:
        return False
    import importlib

    for alias, real in RUNPOD_MODULES.items():
        sys.modules[alias] = importlib.import_module(real)
    return True
