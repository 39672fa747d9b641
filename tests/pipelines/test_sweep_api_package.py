"""``import sdrt`` as an app developer meets it: what ``dir(sdrt)`` offers an IDE or IPython to complete."""

from __future__ import annotations

import subprocess
import sys


def test_dir_lists_the_lazy_names_and_submodules_without_importing_them() -> None:
    """``dir(sdrt)`` listed only what had been imported: ``sdrt.pip<TAB>`` completed nothing in a fresh process."""
    code = ("import sys, sdrt; d = dir(sdrt); "
            "print(all(n in d for n in ('pipelines', 'lora', 'install', 'hardware', 'load', 'errors', 'SdrtError')), "
            "'sdrt.pipelines' in sys.modules, '__main__' in d)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False", "False"]
