"""An S3-compatible server on loopback for tests: moto's ThreadedMotoServer, in this process.

The AWS_* variables point boto/s3fs (in this process and in any run it launches) at it; they are
restored afterwards. Skips the calling test when moto or s3fs is not installed.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest


@contextlib.contextmanager
def s3_bucket() -> Iterator[tuple[Any, str]]:
    """Yields (an s3fs filesystem, "s3://<a new bucket>"). moto keeps its store per process, not
    per server, so every call gets a bucket of its own."""
    server_mod = pytest.importorskip("moto.server",
                                     reason="the S3 test server needs moto[server]: pip install -e '.[test]'")
    s3fs = pytest.importorskip("s3fs", reason="the cold tier on S3 needs s3fs: pip install -e '.[test]'")
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    env = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://{host}:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        fs = s3fs.S3FileSystem(skip_instance_cache=True)
        bucket = f"ckpt-{uuid.uuid4().hex[:12]}"
        fs.mkdir(bucket)
        yield fs, f"s3://{bucket}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
