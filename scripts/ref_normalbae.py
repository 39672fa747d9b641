"""Reference for sdrt's ``normal_bae`` preprocessor: Bae et al.'s NNET as sd-webui-controlnet runs it, on the seeded
scannet.pt files that tests/pipelines/normalbae_helpers.py writes (the full-size B5 one and the narrow one).

    PYTHONPATH=scripts:core/src:tests/pipelines /work/refvenv/bin/python scripts/ref_normalbae.py

The network is controlnet_aux 0.0.10's ``normalbae.nets.NNET`` (the extension's annotator/normalbae models, with
the gen-efficientnet copy both ship; built with ``pretrained=False``, nothing downloaded), loaded with their
``load_checkpoint`` (the checkpoint's ``model`` entry, ``module.`` stripped, ``load_state_dict`` strict). For the
narrow file the same NNET is built with gen-efficientnet's ``_gen_efficientnet`` at channel multiplier 0.25 and
depth 0.5 (TF "same" padding, BN eps 1e-3, as ``tf_efficientnet_b5_ap``) as its encoder and the decoder's first
layers resized to match; the decoder's forward is NNET's own. Around it, this script follows the extension: its
processor's ``normal_bae`` (``resize_image_with_pad``: shorter side to the resolution, INTER_CUBIC up / INTER_AREA
down, edges repeated to multiples of 64; the map cropped back) and ``NormalBaeDetector.__call__`` (``/ 255``,
torchvision's ImageNet ``Normalize``, the model's ``normal[0][-1][:, :3]``, ``((n + 1) * 0.5).clip(0, 1)``,
``* 255`` clipped and cast to uint8). controlnet_aux's own ``NormalBaeDetector.__call__`` resizes to multiples
of 64 instead of padding; the extension wins.

Writes tests/data/normalbae/normalbae_refs.npz: the image; for the narrow file the maps at the image's own
resolution, at 64 (shrinking) and 96 (enlarging, with OpenCV's padded input), and the unit normals of the image
padded at its own size; for the full-size file the map and normals of a 64 x 48 image.
"""

from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def extension_call(model, img):
    """NormalBaeDetector.__call__ after its model is loaded (float32 on the CPU)."""
    import torch
    import torchvision.transforms as transforms
    from einops import rearrange

    norm = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    with torch.no_grad():
        x = torch.from_numpy(img).float() / 255.0
        x = norm(rearrange(x, "h w c -> 1 c h w"))
        normal = model(x)[0][-1][:, :3]
        raw = normal[0].numpy().copy()
        normal = ((normal + 1) * 0.5).clip(0, 1)
        normal = rearrange(normal[0], "c h w -> h w c").cpu().numpy()
        return (normal * 255.0).clip(0, 255).astype(np.uint8), raw


def normal_bae(model, img, res):
    """The extension's processor ``normal_bae``: padded, detected, cropped."""
    from ref_mlsd import resize_image_with_pad

    padded, (h, w) = resize_image_with_pad(img, res)
    return extension_call(model, padded)[0][:h, :w]


def main() -> None:
    from normalbae_helpers import test_image, write_file

    with tempfile.TemporaryDirectory() as tmp:
        tiny_pth = write_file(Path(tmp) / "tiny", tiny=True)
        full_pth = write_file(Path(tmp) / "full", tiny=False)
        import torch  # after write_pth, which refuses to run beside torch

        torch.set_num_threads(2)
        site = next(Path(p) for p in sys.path if (Path(p) / "controlnet_aux").is_dir())
        pkg = types.ModuleType("controlnet_aux")  # its __init__ imports every annotator; only normalbae is needed
        pkg.__path__ = [str(site / "controlnet_aux")]
        sys.modules["controlnet_aux"] = pkg
        import controlnet_aux.normalbae as nb  # noqa: E402  (its NNET, load_checkpoint)
        from controlnet_aux.normalbae.nets.submodules.submodules import UpSampleBN

        sys.path.insert(0, str(site / "controlnet_aux" / "normalbae" / "nets" / "submodules" / "efficientnet_repo"))
        from geffnet import gen_efficientnet

        args = types.SimpleNamespace(mode="client", architecture="BN", pretrained="scannet", sampling_ratio=0.4,
                                     importance_ratio=0.7)
        full = nb.load_checkpoint(str(full_pth), nb.NNET(args)).eval()
        state = torch.load(full_pth)
        assert list(state) == ["model"] and all(k.startswith("module.") for k in state["model"])
        n = sum(v.numel() for k, v in state["model"].items() if v.dtype == torch.float32)
        print("full-size file", full_pth.stat().st_size, "bytes,", n, "values")

        tiny = nb.NNET(args)
        enc = gen_efficientnet._gen_efficientnet("tf_tiny", channel_multiplier=0.25, depth_multiplier=0.5,
                                                 pretrained=False, bn_eps=gen_efficientnet.BN_EPS_TF_DEFAULT,
                                                 pad_type="same")
        enc.global_pool, enc.classifier = torch.nn.Identity(), torch.nn.Identity()
        tiny.encoder.original_model = enc
        tiny.decoder.conv2 = torch.nn.Conv2d(320, 320, kernel_size=1)
        tiny.decoder.up1 = UpSampleBN(320 + 32, 64)
        tiny.decoder.up2 = UpSampleBN(64 + 16, 512)
        tiny.decoder.up3 = UpSampleBN(512 + 8, 256)
        tiny.decoder.up4 = UpSampleBN(256 + 8, 128)
        tiny = nb.load_checkpoint(str(tiny_pth), tiny).eval()

    from ref_mlsd import resize_image_with_pad

    image = test_image()
    h, w = image.shape[:2]
    out = {"image": image}
    for key, res in (("map_own", min(h, w)), ("map_64", 64), ("map_96", 96)):
        out[key] = normal_bae(tiny, image, res)
        print(key, out[key].shape, out[key].reshape(-1, 3).mean(0))
    out["pad_96"] = resize_image_with_pad(image, 96)[0]
    padded, _ = resize_image_with_pad(image, min(h, w))
    _, out["net_own"] = extension_call(tiny, padded)
    small = test_image(64, 48)
    out["full_image"] = small
    out["full_map"] = normal_bae(full, small, 48)
    _, out["full_net"] = extension_call(full, resize_image_with_pad(small, 48)[0])
    print("full", out["full_map"].shape, out["full_map"].reshape(-1, 3).mean(0), out["full_net"].shape)
    dest = ROOT / "tests" / "data" / "normalbae" / "normalbae_refs.npz"
    dest.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(dest, **out)
    print("wrote", dest, dest.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
