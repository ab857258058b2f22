"""How the compiled extension is linked: against the shared libstdc++ that torch runs on.

The H200 image's compiler linked libstdc++ statically into _C.so; the extension then carried a second
copy of the library (its own std::locale ids) and crashed formatting an integer in a TORCH_CHECK
message (kernels_ext/setup.py, _shared_libstdcxx). Linux only, where readelf is installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from qgate_kernels import _library


def _extension_path() -> str:
    import qgate_kernels._C as ext  # noqa: PLC0415 (only once the extension is known to be loaded)

    return ext.__file__


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF shared objects only")
@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf not installed")
@pytest.mark.skipif(not _library.EXTENSION_LOADED, reason="compiled extension not loaded")
def test_extension_needs_the_shared_libstdcxx() -> None:
    dynamic = subprocess.run(
        ["readelf", "-d", _extension_path()], capture_output=True, text=True, check=True
    ).stdout
    assert "[libstdc++.so.6]" in dynamic, dynamic
    symbols = subprocess.run(
        ["readelf", "-W", "--dyn-syms", _extension_path()], capture_output=True, text=True, check=True
    ).stdout
    # A defined (not UND) std::locale::id::_M_id is a copy of libstdc++ inside the extension.
    copies = [
        line for line in symbols.splitlines() if "_ZNKSt6locale2id5_M_idEv" in line and " UND " not in line
    ]
    assert not copies, copies
