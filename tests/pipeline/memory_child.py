"""Peak memory of one protocol run, measured in a process of its own (run as a module).

``python -m tests.pipeline.memory_child '{"protocol": "ridge", ...}'`` builds synthetic
class-clustered features, holds them, warms the protocol up on a tiny copy (imports and
one-time allocations), then runs it once and prints a JSON line: the feature bytes held,
the peak RSS growth during the run (VmHWM reset through /proc/self/clear_refs), the
protocol's own ``memory_bytes`` estimate and the headline (its primary metric). The caller sets
MALLOC_MMAP_THRESHOLD_ (``measurement_env``) so that freed arrays leave the RSS at once.

``--serve`` (``MeasurementServer``) answers one spec per stdin line, each measured in a
process forked for it from a server that has imported torch and the protocols and run
nothing: every measurement starts from the state of a fresh process after those imports
(no earlier run's heap, caches or threads), without paying the seconds of start-up again.
"""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def features(n: int, d: int, n_classes: int, dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Class-clustered features (n, d) in ``dtype`` and their labels, built in row blocks
    (the class centres are the same for every seed; the noise differs)."""
    centres = np.random.default_rng(12345).normal(0.0, 1.0, (n_classes, d)).astype(np.float32)
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % n_classes).astype(np.int64)
    rng.shuffle(y)
    X = np.empty((n, d), dtype=dtype)
    for i in range(0, n, 8192):
        block = centres[y[i:i + 8192]] + rng.normal(0.0, 1.5, (len(y[i:i + 8192]), d)).astype(np.float32)
        X[i:i + 8192] = np.abs(block)
    return X, y


def token_features(n: int, d: int, n_classes: int, dtype: str, seed: int, T: int) -> tuple[np.ndarray, np.ndarray]:
    """``features`` (n, d), each row repeated as T tokens (n, T, d); T = 1: pooled (n, d)."""
    X, y = features(n, d, n_classes, dtype, seed)
    return (np.repeat(X[:, None], T, axis=1) if T > 1 else X), y


def measure(protocol, settings: dict, n_train: int, n_test: int, d: int, K: int, dtype: str, T: int = 1) -> dict:
    """Hold features of this size, run the protocol once, report its peak RSS growth."""
    from pipeline.protocols import EvalData

    X_tr, y_tr = token_features(n_train, d, K, dtype, 0, T)
    X_te, y_te = token_features(n_test, d, K, dtype, 1, T)
    data = EvalData(y_train=y_tr, X_test=X_te, y_test=y_te, n_classes=K, X_train=X_tr)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = _status_bytes("VmRSS")
    result = protocol(data, settings)
    peak = _status_bytes("VmHWM")
    held = X_tr.nbytes + X_te.nbytes
    estimate = protocol.memory_bytes(n_train, n_test, 0, d, K, X_tr.itemsize, settings, n_tokens=T)
    # what the estimate counts as held: the train split too unless the protocol streams it
    modelled_held = X_te.nbytes + (0 if protocol.streams_train else X_tr.nbytes)
    return {"n_train": n_train, "feature_bytes": held, "growth": peak - before,
            "ratio": (held + peak - before) / held, "estimate_extra": estimate - modelled_held,
            "score": result.metrics.get(protocol.primary_metric), "seconds": result.seconds}


def main(spec: dict) -> list[dict]:
    """Warm the protocol up on a tiny cell, then measure each (n_train, n_test) of ``spec["sizes"]``."""
    import torch

    from pipeline.protocols import EvalData, get_protocol

    torch.set_num_threads(1)
    protocol = get_protocol(spec["protocol"])
    settings = spec.get("settings", {})
    K, d, dtype, T = spec["n_classes"], spec["dim"], spec.get("dtype", "float32"), spec.get("tokens", 1)
    X, y = token_features(2000, d, K, dtype, 2, T)
    protocol(EvalData(y_train=y, X_test=X[:200], y_test=y[:200], n_classes=K, X_train=X), settings)  # warm-up
    del X, y
    return [measure(protocol, settings, n_train, n_test, d, K, dtype, T) for n_train, n_test in spec["sizes"]]


def measurement_env() -> dict[str, str]:
    """The measuring processes' environment: freed arrays (over 64 KiB) unmapped at once, one math thread."""
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _other_threads() -> list[str]:
    """Names of this process's threads other than the main one."""
    return [Path(f"/proc/self/task/{t}/comm").read_text().strip() for t in sorted(os.listdir("/proc/self/task"))
            if int(t) != os.getpid()]


def _forked(main: Callable[[dict], list[dict]], spec: dict) -> dict:
    """``main(spec)`` in a child forked for it: ``{"points": ...}`` or ``{"error": ...}``."""
    # a fork copies no thread, only the locks they hold; jemalloc's purger (pyarrow's allocator, started on
    # import) is the exception: jemalloc's fork handlers take its locks across the fork and start none in the child
    threads = [name for name in _other_threads() if name != "jemalloc_bg_thd"]
    if threads:
        return {"error": f"the server runs the threads {threads}; it must fork from its main thread alone"}
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        os.dup2(2, 1)  # anything the run prints goes to the log, not into the server's answers
        try:
            answer, code = {"points": main(spec)}, 0
        except BaseException:
            answer, code = {"error": traceback.format_exc()}, 1
        with os.fdopen(write_end, "w") as f:
            f.write(json.dumps(answer))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        text = f.read()
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    return json.loads(text) if text else {"error": f"the measuring process ended ({code}) without an answer"}


def serve(main: Callable[[dict], list[dict]], preload: Iterable[str]) -> None:
    """Import ``preload``, then answer each spec line of stdin with ``main(spec)`` run in a forked child."""
    for name in preload:
        importlib.import_module(name)
    for line in sys.stdin:
        print(json.dumps(_forked(main, json.loads(line))), flush=True)
    os._exit(0)  # stdin closed: nothing to keep, so no interpreter teardown (torch's takes a second)


class MeasurementServer:
    """``python -m MODULE --serve``, started once (its stderr in ``log``) and again only if it ended."""

    def __init__(self, module: str, log: Path):
        self._module, self._path, self._log = module, log, open(log, "a")
        self._proc = self._start()

    def _start(self) -> subprocess.Popen:
        # a session of its own: ``_end`` also ends a measuring child left running
        return subprocess.Popen([sys.executable, "-m", self._module, "--serve"], cwd=ROOT, env=measurement_env(),
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                start_new_session=True)

    def measure(self, spec: dict) -> list[dict]:
        """The points ``main(spec)`` returned in its own forked child; fails with its traceback and the log."""
        if self._proc.poll() is not None:
            self._end()
            self._proc = self._start()
        try:
            self._proc.stdin.write(json.dumps(spec) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        except BaseException:  # a timeout: the answer may still come, to the next question
            self._end()
            raise
        answer = json.loads(line) if line else {"error": f"the server ended ({self._proc.poll()})"}
        if "error" in answer:
            raise AssertionError(f"{answer['error']}\n{self._path.read_text(errors='replace')[-3000:]}")
        return answer["points"]

    def _end(self, wait: float = 0) -> None:
        try:
            self._proc.stdin.close()
            self._proc.wait(timeout=wait)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        self._proc.stdout.close()

    def close(self) -> None:
        """End the server (its stdin closed; killed if it has not ended within a minute) and its log."""
        self._end(wait=60)
        self._log.close()


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        # what every run imports anyway, before its warm-up (torch, the registry; the row checks and transforms
        # every pooled or token protocol reads through, with scikit-learn and scipy)
        serve(main, ["torch", "pipeline.protocols", "pipeline.protocols.inputs.features",
                     "pipeline.protocols.inputs.labels", "pipeline.protocols.transforms.transformers"])
    else:
        print(json.dumps(main(json.loads(sys.argv[1]))))
