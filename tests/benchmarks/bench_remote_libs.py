"""Download throughput from a local S3 server (moto): fsspec + s3fs against obstore.

    python tests/benchmarks/bench_remote_libs.py [--objects 8] [--mib 32]

Chose the library behind `rectool[remote]` (docs/remote.md). Both fetch the same objects,
whole, from the same server on 127.0.0.1, one at a time and then 4 at once; best of 3.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--objects", type=int, default=8)
    parser.add_argument("--mib", type=int, default=32)
    args = parser.parse_args()
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"
    )
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="bench")
        body = os.urandom(args.mib << 20)
        keys = [f"shard-{i:05d}.rec" for i in range(args.objects)]
        for key in keys:
            s3.put_object(Bucket="bench", Key=key, Body=body)
        total = len(keys) * len(body)

        import obstore
        import s3fs
        from obstore.store import S3Store

        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="test", secret="test")
        store = S3Store(
            "bench",
            endpoint=endpoint,
            region="us-east-1",
            client_options={"allow_http": True},
            access_key_id="test",
            secret_access_key="test",
        )

        def via_s3fs(key):
            return len(fs.cat_file(f"bench/{key}"))

        def via_obstore(key):
            return len(obstore.get(store, key).bytes())

        def via_obstore_stream(key):
            return sum(len(c) for c in obstore.get(store, key).stream(min_chunk_size=4 << 20))

        for name, fetch in (
            ("s3fs", via_s3fs),
            ("obstore", via_obstore),
            ("obstore stream", via_obstore_stream),
        ):
            for threads in (1, 4):
                best = None
                for _ in range(3):
                    start = time.perf_counter()
                    with ThreadPoolExecutor(threads) as pool:
                        got = sum(pool.map(fetch, keys))
                    assert got == total
                    took = time.perf_counter() - start
                    best = took if best is None else min(best, took)
                print(f"{name:15s} {threads} at once: {total / best / 1e6:8.1f} MB/s")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
