"""A real S3 endpoint for the scale-out tests: moto's server on 127.0.0.1, in this process.

Clients find it the way a user's would: through environment variables only (botocore
reads ``AWS_ENDPOINT_URL_S3``, the key id and the secret), so subprocesses, Dask workers
and Prefect tasks inherit it and no credential ever appears in a URL or a config. The key
id and secret are distinctive planted values that the leak test searches for.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from tests.helpers.s3 import BUCKET, PLANTED_KEY_ID, PLANTED_SECRET


@pytest.fixture(scope="package")
def s3_endpoint(tmp_path_factory):
    """Start moto's S3 server, export its endpoint and the planted credentials, make the bucket."""
    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one access-log line per request otherwise
    _atomic_conditional_puts()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    nowhere = str(tmp_path_factory.mktemp("aws") / "absent")  # no user ~/.aws files may leak in
    env = {
        "AWS_ENDPOINT_URL_S3": endpoint, "AWS_ACCESS_KEY_ID": PLANTED_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": PLANTED_SECRET, "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": nowhere, "AWS_SHARED_CREDENTIALS_FILE": nowhere,
    }
    unset = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL")  # the machine's own, if any
    saved = {k: os.environ.get(k) for k in (*env, *unset)}
    for k in unset:
        os.environ.pop(k, None)
    os.environ.update(env)
    # fsspec caches filesystems by their arguments, not by the endpoint they read from the
    # environment: one cached by an earlier set-up in this process would call a stopped server
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        s3fs.S3FileSystem(skip_instance_cache=True).mkdir(BUCKET)
        yield endpoint
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        # moto keeps its buckets in process-wide state that outlives the server: forget them,
        # so a later set-up in this process (pytest-xdist runs packages in pieces) starts empty
        httpx.post(f"{endpoint}/moto-api/reset", timeout=30)
        server.stop()
        s3fs.S3FileSystem.clear_instance_cache()


def _atomic_conditional_puts() -> None:
    """S3 decides ``If-None-Match: *`` and the write as one step; moto checks, then writes, so
    two racing creators can both pass its check on a busy machine. One lock around moto's
    object PUT gives the stand-in the guarantee the store relies on from the real service."""
    from moto.s3.responses import S3Response

    if getattr(S3Response.put_object, "_serialised", False):
        return
    lock = threading.Lock()
    put_object = S3Response.put_object

    def serialised(self, *args, **kwargs):
        with lock:
            return put_object(self, *args, **kwargs)

    serialised._serialised = True
    S3Response.put_object = serialised


@pytest.fixture
def s3_url(s3_endpoint) -> str:
    """A fresh store location in the bucket."""
    return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="package")
def prefect_api(prefect_harness):
    """The session's Prefect API for every `repeval run` subprocess here (passed on through
    PREFECT_API_URL), so no run starts a temporary server of its own. Returns (API URL,
    folder of its SQLite database, which the leak test searches)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_DATABASE_CONNECTION_URL

    database = PREFECT_SERVER_DATABASE_CONNECTION_URL.value()
    assert database.startswith("sqlite+aiosqlite:///"), database
    return PREFECT_API_URL.value(), Path(database.removeprefix("sqlite+aiosqlite:///")).parent
