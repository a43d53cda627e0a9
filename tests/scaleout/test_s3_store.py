"""The feature store on S3 (moto's real server, s3fs clients): extraction, resume after a
SIGKILL, and the exclusive create that leases and the ledger rest on."""

from __future__ import annotations

import subprocess
import threading
import time

import numpy as np
import pytest
import s3fs

from jobs.config import load_config
from jobs.extraction.extract import ExtractConfig, extract
from pipeline.datasets import make_dataset
from pipeline.encoders import EncoderSpec, load_encoder
from pipeline.errors import ConfigError, LeaseLostError
from storage_schema import FeatureStore, keys
from storage_schema.backend import redact_url, url_has_password
from tests.helpers.cli import REPO, cli_command, cli_env, extract_here, run_cli
from tests.helpers.s3 import PLANTED_KEY_ID, PLANTED_SECRET
from tests.helpers.leases import LeaseContract

LAYERS = ("pre_logits", "block3")
KEY = "features/r18/textures/train/pre_logits"


@pytest.fixture
def store_url(s3_url) -> str:
    """The S3 variant of the suite's ``store_url`` for the imported lease tests."""
    return s3_url


class TestLeaseContractOnS3(LeaseContract):
    """The lease behaviour of the local store, on S3 (``store_url`` above)."""


def _arrays(store: FeatureStore, split: str) -> dict[str, np.ndarray]:
    return {layer: store.features("r18", "textures", split, layer).read() for layer in LAYERS}


def _markers(fs: s3fs.S3FileSystem, url: str, key: str) -> list[str]:
    """Chunk-done markers of ``key``, listed afresh from the bucket."""
    return fs.glob(f"{url.removeprefix('s3://')}/{keys.chunk_markers_key(key, '*')}/*")


def test_extraction_to_s3_equals_local_bitwise_with_provenance(s3_url, tmp_path):
    textures = make_dataset("textures", n_per_class={"train": 8, "test": 16})
    encoder = load_encoder(EncoderSpec(name="r18", arch="resnet18", layers=LAYERS, input_size=32))
    cfg = ExtractConfig(batch_size=8, chunk_batches=2, progress=False)
    remote, local = FeatureStore(s3_url), FeatureStore(str(tmp_path / "local"))
    t0 = time.perf_counter()
    report = extract(remote, encoder, textures, "test", cfg)
    print(f"s3 extraction: {report.images} images in {time.perf_counter() - t0:.2f} s")
    assert report.status == "extracted" and report.forward_batches == 8
    extract(local, encoder, textures, "test", cfg)
    reopened = FeatureStore(s3_url, read_only=True)  # a fresh client: everything came from the bucket
    for layer, arr in _arrays(reopened, "test").items():
        assert arr.tobytes() == _arrays(local, "test")[layer].tobytes()
    assert reopened.labels("textures", "test").read().tobytes() == local.labels("textures", "test").read().tobytes()
    stored = reopened.features("r18", "textures", "test", "pre_logits")
    prov = stored.attrs
    assert prov["encoder"]["arch"] == "resnet18" and prov["encoder"]["weights_fingerprint"]
    assert prov["fingerprint"] == local.features("r18", "textures", "test", "pre_logits").fingerprint
    assert prov["libraries"]["zarr"] and prov["dataset_fingerprint"]
    assert prov["labels"] == "datasets/textures/test/labels"
    assert [s.key for s in reopened.list_arrays()] == [s.key for s in local.list_arrays()]
    assert all(s.complete for s in reopened.list_arrays()) and reopened.damaged_chunks(stored.key) == []
    # a second extraction finds the complete arrays in the bucket: no forward pass
    assert extract(FeatureStore(s3_url), encoder, textures, "test", cfg).status == "cached"


@pytest.mark.slow
def test_sigkilled_cli_extraction_to_s3_resumes_bitwise(s3_url, tmp_path):
    """`repeval extract --store s3://...` killed mid-run; the endpoint and credentials reach
    the subprocess through its environment only."""
    env = cli_env()
    assert env["AWS_ENDPOINT_URL_S3"] and env["AWS_SECRET_ACCESS_KEY"] == PLANTED_SECRET
    killed = subprocess.Popen(cli_command(s3_url), env=env, cwd=REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    block3 = KEY.replace("pre_logits", "block3")  # written after pre_logits in each chunk
    fs = s3fs.S3FileSystem(use_listings_cache=False)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and killed.poll() is None:
        if len(_markers(fs, s3_url, block3)) >= 5:
            killed.kill()
            break
        time.sleep(0.05)
    killed.wait()
    assert killed.returncode == -9, "the extraction finished before it could be killed"
    store = FeatureStore(s3_url)
    st = store.status(KEY)
    n_chunks = st.n_chunks
    missing = set()
    for layer in LAYERS:
        layer_st = store.status(KEY.replace("pre_logits", layer))
        missing |= set(range(n_chunks)) - set(layer_st.done_chunks if layer_st else ())
    assert not st.complete and 0 < len(missing) <= n_chunks - 5
    t0 = time.perf_counter()
    report = run_cli(s3_url)
    print(f"killed after {n_chunks - len(missing)} of {n_chunks} chunks; resume recomputed "
          f"{len(missing)} chunks ({report['forward_batches']} batches) in {time.perf_counter() - t0:.1f} s")
    assert report["status"] == "resumed" and report["forward_batches"] == 2 * len(missing)
    extract_here(str(tmp_path / "ref"))  # what the command extracts uninterrupted
    expected = _arrays(FeatureStore(str(tmp_path / "ref"), read_only=True), "train")
    resumed = FeatureStore(s3_url, read_only=True)
    assert resumed.status(KEY).fingerprint == FeatureStore(str(tmp_path / "ref")).status(KEY).fingerprint
    for layer, arr in _arrays(resumed, "train").items():
        assert arr.tobytes() == expected[layer].tobytes()


def _race(contenders, attempt) -> list[bool]:
    """Run ``attempt(contender)`` on every contender at once (threads, one S3 client each)."""
    barrier = threading.Barrier(len(contenders))
    results: list[bool | None] = [None] * len(contenders)

    def run(i: int) -> None:
        barrier.wait()
        results[i] = attempt(contenders[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(contenders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_exclusive_create_and_lease_takeover_race_on_s3(s3_url):
    """s3fs sends ``xb`` writes as a PUT with ``If-None-Match: *``: of racing creators the
    server lets exactly one through, on a fresh lease and on the takeover of an expired one."""
    FeatureStore(s3_url)
    # separate clients (own connection pools), as separate processes would have
    stores = [FeatureStore(s3_url, storage_options={"skip_instance_cache": True}) for _ in range(4)]
    rounds = 12
    for r in range(rounds):
        key = f"_repeval/probe/{r}"
        won = _race(stores, lambda s: s.backend.create_exclusive(key, s.backend.url.encode() + str(id(s)).encode()))
        assert won.count(True) == 1, f"round {r}: {won}"
        winner = stores[won.index(True)]
        assert stores[0].backend.read(key) == winner.backend.url.encode() + str(id(winner)).encode()
    print(f"{rounds} rounds of 4 racing exclusive creates: exactly one winner each")

    for r in range(3):
        key = f"features/m/race{r}/train"
        # fresh lease: one of four wins generation 0
        leases = [s.lease(key, ttl=0.4, heartbeat=3600) for s in stores]  # they never beat
        won = _race(leases, lambda lease: lease.try_acquire())
        assert won.count(True) == 1
        holder = leases[won.index(True)]
        assert holder.current().generation == 0 and holder.current().owner == holder.owner
        time.sleep(0.6)  # the holder stopped beating: its lease expires
        takers = [s.lease(key, ttl=30) for s in stores[:3]]
        won = _race(takers, lambda lease: lease.try_acquire())
        assert won.count(True) == 1, won
        new = takers[won.index(True)]
        assert new.current().generation == 1 and new.current().owner == new.owner
        with pytest.raises(LeaseLostError, match="taken over"):
            holder.check()
        holder.release()  # must not free the new holder's lease
        assert not new.current().released
        new.release()
        for lease in leases:
            lease.release()


def test_credentials_in_urls_are_redacted_and_refused_in_configs(s3_url):
    with_creds = f"s3://{PLANTED_KEY_ID}:{PLANTED_SECRET}@bucket/prefix"
    assert redact_url(with_creds) == "s3://bucket/prefix" and url_has_password(with_creds)
    assert redact_url(f"https://user:{PLANTED_SECRET}@host.example/store") == "https://host.example/store"
    assert not url_has_password("abfs://container@account/store") and not url_has_password(s3_url)
    assert FeatureStore(s3_url).url == s3_url
    # a config travels to Prefect's database and into the report: no credentials in it
    base = {"encoders": [{"name": "a", "arch": "resnet18"}], "datasets": [{"name": "t", "adapter": "textures"}],
            "protocols": [{"name": "k", "protocol": "knn"}]}
    with pytest.raises(ConfigError, match="password in its URL") as err:
        load_config({**base, "store": with_creds})
    assert PLANTED_SECRET not in str(err.value) and PLANTED_KEY_ID not in str(err.value)
    for options in ({"secret": PLANTED_SECRET}, {"client_kwargs": {"aws_secret_access_key": PLANTED_SECRET}}):
        with pytest.raises(ConfigError, match="AWS_SECRET_ACCESS_KEY") as err:
            load_config({**base, "store": s3_url, "storage_options": options})
        assert PLANTED_SECRET not in str(err.value)
    assert load_config({**base, "store": s3_url, "storage_options": {"endpoint_url": "http://minio:9000"}})
