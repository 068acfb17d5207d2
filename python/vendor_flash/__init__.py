"""vendor-flash: worker SDK for flashd queue endpoints, compatible with runpod-python.

``import vendor_flash as runpod`` gives the familiar ``runpod.serverless.start(...)`` and
``runpod.serverless.progress_update(...)``. :func:`install_runpod_alias` goes one step further
and lets unchanged ``import runpod`` code load this package.
"""

from __future__ import annotations

import sys

from . import serverless
from .version import __version__

__all__ = ["serverless", "__version__", "install_runpod_alias"]


def install_runpod_alias(force: bool = False) -> bool:
    """Register this package as ``runpod`` (and ``runpod.serverless``) in ``sys.modules``.

    Does nothing when a real ``runpod`` is already imported, unless ``force``. Returns True when
    the alias was installed.
    """
    if "runpod" in sys.modules and not force:
        return False
    sys.modules["runpod"] = sys.modules[__name__]
    sys.modules["runpod.serverless"] = serverless
    return True
