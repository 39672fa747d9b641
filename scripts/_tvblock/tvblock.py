"""Hide the torch venv's torchvision (built for another torch) from transformers; scripts only."""
import transformers.utils.import_utils as iu

if hasattr(iu, "_torchvision_available"):
    iu._torchvision_available = False
else:
    _orig = iu._is_package_available

    def _no_tv(name, *a, **k):
        return (False, "N/A") if name == "torchvision" else _orig(name, *a, **k)

    iu._is_package_available = _no_tv
    iu.is_torchvision_available.cache_clear()

try:  # the transformers-4 overlay's huggingface_hub is too old for diffusers: not needed there
    import diffusers.utils.import_utils as diu
except ImportError:
    diu = None
if diu is not None and hasattr(diu, "_torchvision_available"):
    diu._torchvision_available = False
