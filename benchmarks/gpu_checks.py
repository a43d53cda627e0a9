"""Every check and benchmark that needs a GPU, in one command, results written to a folder.

Checks (``--only`` picks some; each writes its part of ``results.json`` as soon as it is
done, so a run stopped by a time limit keeps what it measured):

* ``agreement``: every protocol with a ``device`` setting (ridge, k-NN, logistic with its
  C grid, few-shot, low-shot, and the MLP where registered) on the same synthetic features with ``device: cpu``
  and with ``device: <--device>``; the scores side by side and their difference (the
  GPU computes in other orders and, for the MLP, with other random streams, so scores
  agree to rounding, not bitwise; ``--tolerance`` decides the verdict);
* ``knn``: k-NN (k = 20, cosine, exp weights) with 50,000 queries against 1.28 M x 768
  float16 train rows, 1,000 classes, on the device (goal: < 30 s);
* ``logistic``: the logistic probe with its 45-value C grid at 1.28 M x 768 float16,
  1,000 classes (goal: < 10 minutes);
* ``extraction``: ResNet-50 at 224 px over a folder of JPEGs (ImageNet-like sizes):
  images/s of ``jobs.extraction.extract.extract`` (its defaults on the device: float16 autocast,
  channels-last, pinned memory, one DataLoader worker per core; PIL decoding, then
  decoding on the device) against the loop a user would write with timm and torchvision
  (the same model, autocast and channels-last, ``ImageFolder`` with timm's transform,
  the same DataLoader workers and pinning, features copied to the host); a warm-up of
  each side, then alternating timed passes, medians.

The k-NN and logistic points run through ``benchmarks/bench_scale.py``'s measured child
process (fresh process, features held, peak RSS growth and peak GPU memory).

``--smoke`` runs all of it at toy sizes on the CPU (``--device cpu``) in under a minute:
the script is tested that way, and then only proves that it runs, not any speed. On a
GPU machine: ``.venv/bin/python benchmarks/gpu_checks.py --out gpu-results`` (about 15
minutes on one H200; ``--only knn extraction`` for less). ``results.markdown`` holds the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from benchmarks._common import machine_line, markdown_table, median  # noqa: E402

CHECKS = ("agreement", "knn", "logistic", "extraction")
FULL = {"agreement": dict(n=20_000, dim=256, classes=20, test=4_000),
        "scale": dict(n=1_280_000, dim=768, classes=1000, knn_test=50_000, logistic_test=10_000, dtype="float16"),
        "extraction": dict(arch="resnet50", input_size=224, images=8_192, batch_size=256, repeats=3, shrink=1)}
SMOKE = {"agreement": dict(n=400, dim=16, classes=5, test=100),
         "scale": dict(n=1_000, dim=16, classes=5, knn_test=200, logistic_test=100, dtype="float16"),
         "extraction": dict(arch="resnet18", input_size=32, images=8, batch_size=4, repeats=1, shrink=8)}
GOALS = {"knn": 30.0, "logistic": 600.0}


# -- agreement ------------------------------------------------------------------------------
def agreement_settings(smoke: bool) -> dict[str, dict]:
    """The protocols compared, with settings that keep the smoke run short."""
    few = {"n_episodes": 50} if smoke else {}
    return {"ridge": {}, "knn": {}, "logistic": {"Cs": "default"}, "fewshot": {"n_way": 5, "n_shot": 5, **few},
            "lowshot": {"shots": [1, 4, "all"], "n_seeds": 2} if smoke else {},
            "mlp": {"max_epochs": 3, "weight_decays": [0.0]} if smoke else {}}


def check_agreement(device: str, sizes: dict, smoke: bool, tolerance: float) -> list[dict]:
    from benchmarks.bench_scale import synthetic
    from pipeline.protocols import EvalData, get_protocol, list_protocols

    X, y = synthetic(sizes["n"], sizes["dim"], sizes["classes"], "float32", 0)
    X_te, y_te = synthetic(sizes["test"], sizes["dim"], sizes["classes"], "float32", 1)
    data = EvalData(y_train=y, X_test=X_te, y_test=y_te, n_classes=sizes["classes"], X_train=X)
    rows = []
    for name, settings in agreement_settings(smoke).items():
        if name not in list_protocols():  # a protocol this checkout does not register yet
            continue
        scores, seconds = {}, {}
        for side, where in (("cpu", "cpu"), ("device", device)):
            started = time.perf_counter()
            result = get_protocol(name)(data, {**settings, "device": where})
            seconds[side] = time.perf_counter() - started
            metrics = result.metrics
            scores[side] = float(metrics["score"] if "score" in metrics else metrics["curve"]["all"])
        diff = abs(scores["cpu"] - scores["device"])
        rows.append({"protocol": name, "cpu_score": scores["cpu"], "device_score": scores["device"], "difference": diff,
                     "cpu_s": seconds["cpu"], "device_s": seconds["device"], "agree": diff <= tolerance})
    return rows


# -- k-NN and logistic at ImageNet size -----------------------------------------------------
def check_scale(protocol: str, device: str, sizes: dict) -> dict:
    from benchmarks.bench_scale import run_point

    spec = {"dim": sizes["dim"], "classes": sizes["classes"], "dtype": sizes["dtype"], "device": device,
            "threads": None, "protocol": protocol, "n": sizes["n"], "side": "ours",
            "logistic_grid": protocol == "logistic",
            "test": sizes["knn_test"] if protocol == "knn" else sizes["logistic_test"]}
    res = run_point(spec)
    if res is None:
        return {"protocol": protocol, "failed": True}
    return {"protocol": protocol, "n": sizes["n"], "queries": spec["test"], "seconds": res["seconds"],
            "score": res["score"], "rss_growth_mib": res["growth"] / 2**20, "gpu_peak_mib": res["gpu_peak"] / 2**20,
            "goal_s": GOALS[protocol], "met": res["seconds"] < GOALS[protocol]}


# -- extraction -----------------------------------------------------------------------------
def jpeg_folder(root: Path, n: int, shrink: int = 1) -> Path:
    """``n`` JPEGs of ImageNet-like sizes (divided by ``shrink``) in 8 class folders (split ``train``)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    sizes = [(375, 500), (500, 375), (333, 500), (480, 640)]
    for i in range(n):
        h, w = (side // shrink for side in sizes[i % len(sizes)])
        folder = root / "train" / f"c{i % 8}"
        folder.mkdir(parents=True, exist_ok=True)
        yy, xx = np.mgrid[0:h, 0:w]
        img = np.stack([np.sin(xx / (5 + i % 7)) * 100 + 128, np.cos(yy / (4 + i % 5)) * 100 + 128,
                        (xx + yy + i) % 256], -1) + rng.normal(0, 12, (h, w, 3))
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"{i:06d}.jpg", quality=90)
    return root


def bare_loop(arch: str, input_size: int, root: Path, batch_size: int, device: str, workers: int, pin: bool,
              autocast: bool, channels_last: bool) -> int:
    """What a user writes with timm and torchvision: features of every image, to the host."""
    import timm
    import torch
    from timm.data import create_transform, resolve_data_config
    from torch.utils.data import DataLoader
    from torchvision.datasets import ImageFolder

    model = timm.create_model(arch, pretrained=False, num_classes=0).to(device).eval()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    config = resolve_data_config({"input_size": (3, input_size, input_size)}, model=model)
    loader = DataLoader(ImageFolder(str(root / "train"), transform=create_transform(**config)),
                        batch_size=batch_size, num_workers=workers, pin_memory=pin)
    images = 0
    with torch.inference_mode(), torch.autocast(torch.device(device).type, dtype=torch.float16, enabled=autocast):
        for x, _ in loader:
            x = x.to(device, non_blocking=True)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            images += model(x).float().cpu().shape[0]
    return images


def check_extraction(device: str, sizes: dict, work: Path) -> list[dict]:
    from jobs.config import ExtractConfig
    from jobs.extraction.extract import extract
    from jobs.extraction.forward import loader_settings
    from pipeline.datasets import make_dataset
    from pipeline.encoders import EncoderSpec, load_encoder
    from storage_schema import FeatureStore

    root = jpeg_folder(work / "jpegs", sizes["images"], sizes["shrink"])
    dataset = make_dataset("image_folder", name="jpegs", root=str(root))
    encoder = load_encoder(EncoderSpec(name="r", arch=sizes["arch"], input_size=sizes["input_size"]), device=device)
    workers, pin = loader_settings("auto", "auto", encoder.device)
    runs = {"n": 0}

    def job(decode: str):
        def run() -> int:
            runs["n"] += 1
            store = FeatureStore(str(work / f"store-{runs['n']}"))
            report = extract(store, encoder, dataset, "train", ExtractConfig(batch_size=sizes["batch_size"],
                                                                            progress=False, decode=decode))
            shutil.rmtree(work / f"store-{runs['n']}", ignore_errors=True)
            return report.images
        return run

    def bare() -> int:
        return bare_loop(sizes["arch"], sizes["input_size"], root, sizes["batch_size"], device, workers, pin,
                         encoder.autocast, encoder.channels_last)

    sides = {"bare timm loop": bare, "extract (PIL decode)": job("pil"), "extract (decode on device)": job("device")}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for name, fn in sides.items():  # warm-up
        fn()
    for _ in range(sizes["repeats"]):
        for name, fn in sides.items():
            started = time.perf_counter()
            images = fn()
            times[name].append(time.perf_counter() - started)
            if images != sizes["images"]:
                raise RuntimeError(f"{name}: {images} images instead of {sizes['images']}")
    bare_rate = sizes["images"] / median(times["bare timm loop"])
    return [{"side": name, "model": f"{sizes['arch']} @{sizes['input_size']}px", "images": sizes["images"],
             "images_per_s": sizes["images"] / median(t), "vs_bare": sizes["images"] / median(t) / bare_rate,
             "workers": workers, "pin_memory": pin, "precision": encoder.compute_precision, "seconds": t}
            for name, t in times.items()]


# -- the run --------------------------------------------------------------------------------
def tables(results: dict) -> str:
    out = []
    if "agreement" in results:
        out += ["## Protocols on the CPU and on the device", "", markdown_table(
            ["protocol", "score (cpu)", "score (device)", "difference", "cpu s", "device s", "agree"],
            [[r["protocol"], f"{r['cpu_score']:.4f}", f"{r['device_score']:.4f}", f"{r['difference']:.2g}",
              r["cpu_s"], r["device_s"], "yes" if r["agree"] else "NO"] for r in results["agreement"]]), ""]
    scale = [results[k] for k in ("knn", "logistic") if k in results]
    if scale:
        out += ["## ImageNet-size protocols on the device", "", markdown_table(
            ["protocol", "train rows", "test rows", "seconds", "goal s", "verdict", "score", "RSS growth MiB",
             "GPU peak MiB"],
            [["FAILED"] if r.get("failed") else
             [r["protocol"], r["n"], r["queries"], r["seconds"], r["goal_s"], "met" if r["met"] else "MISSED",
              f"{r['score']:.4f}", r["rss_growth_mib"], r["gpu_peak_mib"]] for r in scale]), ""]
    if "extraction" in results:
        out += ["## Extraction throughput", "", markdown_table(
            ["side", "model", "images", "images/s", "vs bare loop", "DataLoader workers", "pinned", "precision"],
            [[r["side"], r["model"], r["images"], r["images_per_s"], f"{r['vs_bare']:.2f}x", r["workers"],
              r["pin_memory"], r["precision"]] for r in results["extraction"]]), ""]
    return "\n".join(out)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for results.json, results.markdown and the machine line")
    p.add_argument("--device", default=None, help="the device checked (default: cuda; cpu with --smoke)")
    p.add_argument("--only", nargs="+", choices=CHECKS, default=list(CHECKS))
    p.add_argument("--smoke", action="store_true", help="toy sizes (runs on the CPU in under a minute)")
    p.add_argument("--tolerance", type=float, default=0.01, help="largest score difference called agreement")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = args.device or ("cpu" if args.smoke else "cuda")
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(f"gpu_checks: device {device!r} asked for and no GPU is visible (use --smoke on the CPU)")
    sizes = SMOKE if args.smoke else FULL
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"machine": machine_line(), "device": device, "smoke": args.smoke,
                     "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None}
    print(f"gpu_checks on {device}{' (smoke sizes)' if args.smoke else ''}; {results['machine']}", flush=True)

    def save(name: str, value, started: float) -> None:
        results[name] = value
        results.setdefault("seconds", {})[name] = time.perf_counter() - started
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (out / "results.markdown").write_text(f"# GPU checks\n\n{results['machine']}; device {device}"
                                        f"{' (' + results['gpu'] + ')' if results['gpu'] else ''}\n\n{tables(results)}")
        print(f"  {name}: done in {results['seconds'][name]:.0f} s", flush=True)

    for check in args.only:
        started = time.perf_counter()
        if check == "agreement":
            save(check, check_agreement(device, sizes["agreement"], args.smoke, args.tolerance), started)
        elif check in ("knn", "logistic"):
            save(check, check_scale(check, device, sizes["scale"]), started)
        else:
            work = Path(tempfile.mkdtemp(prefix="repeval-gpu-extract-"))
            try:
                save(check, check_extraction(device, sizes["extraction"], work), started)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    print(tables(results))
    return results


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
