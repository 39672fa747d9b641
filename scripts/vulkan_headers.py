"""Assemble a Vulkan include folder new enough for ggml's Vulkan backend, outside the repository.

    python scripts/vulkan_headers.py --out build/vk [--headers DIR] [--hpp DIR]

ggml 0.15 (ggml-python 0.0.45) builds its Vulkan backend against Vulkan 1.4-era headers
(it uses ``VK_EXT_layer_settings``) and includes the C++ bindings (``vulkan/vulkan.hpp``).
Debian 12 ships 1.3.239. This script puts the C headers of a Khronos Vulkan-Headers checkout
and its C++ headers into ``OUT/include``; a checkout whose ``vulkan_structs.hpp`` is missing
(an incomplete snapshot) gets its C++ headers generated from ``registry/vk.xml`` with
Vulkan-Hpp's ``VulkanHppGenerator`` (built here with g++ and tinyxml2:
``apt install g++ libtinyxml2-dev``). Without ``--headers``/``--hpp`` the two repositories are
cloned with git at the tags below. Prints the include folder to pass as ``-DVulkan_INCLUDE_DIR``.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

HEADERS_URL = "https://github.com/KhronosGroup/Vulkan-Headers"
HPP_URL = "https://github.com/KhronosGroup/Vulkan-Hpp"
#: the Vulkan-Headers tag, and the Vulkan-Hpp commit whose generator matches its vk.xml
#: ("Update Vulkan-Headers to v1.4.359"; later generators use C++20 <format>, which g++ 12 lacks)
HEADERS_TAG = "v1.4.359"
HPP_COMMIT = "89e6fb2b"


def _run(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def _clone(url: str, ref: str, dest: Path) -> Path:
    if not dest.exists():
        _run(["git", "clone", "--quiet", url, str(dest)])
        _run(["git", "-C", str(dest), "checkout", "--quiet", ref])
    return dest


def _generate_hpp(hpp: Path, registry: Path, work: Path) -> Path:
    """Build VulkanHppGenerator from ``hpp``/generator and run it on ``registry``/vk.xml; the folder
    holding the generated vulkan*.hpp."""
    src = work / "Vulkan-Hpp"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(hpp / "generator", src / "generator")
    (src / "vulkan").mkdir(parents=True)
    for f in (hpp / "vulkan").glob("vulkan_video.*"):  # written by the video generator, from video.xml
        shutil.copy2(f, src / "vulkan" / f.name)
    exe = src / "VulkanHppGenerator"
    gen = src / "generator"
    _run(["g++", "-std=c++20", "-O1", f'-DBASE_PATH="{src}"', f'-DVK_SPEC="{registry / "vk.xml"}"',
          str(gen / "VulkanHppGenerator.cpp"), str(gen / "VkXMLParser.cpp"), str(gen / "DependencyParser.cpp"),
          "-ltinyxml2", "-lpthread", "-o", str(exe)])
    _run([str(exe)], cwd=src)
    return src / "vulkan"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="work folder (outside the repository)")
    ap.add_argument("--headers", type=Path, help="a Vulkan-Headers checkout (default: clone it)")
    ap.add_argument("--hpp", type=Path, help="a Vulkan-Hpp checkout (default: clone it when needed)")
    args = ap.parse_args()
    out: Path = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    headers = args.headers or _clone(HEADERS_URL, HEADERS_TAG, out / "Vulkan-Headers")
    include = out / "include"
    if include.exists():
        shutil.rmtree(include)
    shutil.copytree(headers / "include", include)
    if not (include / "vulkan" / "vulkan_structs.hpp").exists():
        hpp = args.hpp or _clone(HPP_URL, HPP_COMMIT, out / "Vulkan-Hpp-src")
        for f in _generate_hpp(hpp, headers / "registry", out).glob("*.hpp"):
            shutil.copy2(f, include / "vulkan" / f.name)
    missing = [h for h in ("vulkan_core.h", "vulkan.hpp", "vulkan_structs.hpp", "vulkan_funcs.hpp",
                           "vulkan_handles.hpp", "vulkan_enums.hpp")
               if not (include / "vulkan" / h).exists()]
    if missing:
        print(f"error: {include}/vulkan lacks {', '.join(missing)}", file=sys.stderr)
        return 1
    print(include)
    return 0


if __name__ == "__main__":
    sys.exit(main())
