"""A remote pack opens where a local one does: `open_dataset(URL)` over a shard cache, on a real
S3 server (moto) and a plain HTTP server of byte ranges, both on 127.0.0.1 (conftest.py)."""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers.servers import no_wait

from rectool import open_dataset
from rectool.remote import Retry
from rectool.remote.dataset import RemoteDataset
from rectool.training import Loader


def no_sleep():
    sleeps = []
    return Retry(sleep=sleeps.append, jitter=False), sleeps


def opened(pack, tmp_path, **options):
    options.setdefault("retry", no_sleep()[0])
    return open_dataset(pack.url, cache_dir=str(tmp_path / "cache"), **options)


def rec_gets(faults):
    return {name: n for name, n in faults.gets.items() if name.endswith(".rec")}


def test_a_remote_pack_reads_the_same_samples_as_the_local_pack(remote_pack, tmp_path):
    ds, local = opened(remote_pack, tmp_path), open_dataset(str(remote_pack.local))
    assert isinstance(ds, RemoteDataset) and len(ds) == len(local) == 12
    assert [bytes(ds.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert ds.labels.tolist() == local.labels.tolist()
    assert ds.keys.tolist() == local.keys.tolist()


INDEX_FILES = ["faces.offsets.npy", "faces.keys.npy", "faces.labels.npy"]


def test_opening_fetches_the_manifest_and_binary_index_and_a_shard_only_when_it_is_read(
    s3_pack, tmp_path
):
    ds = opened(s3_pack, tmp_path)
    assert dict(s3_pack.faults.gets) == {"faces.manifest.json": 1, **dict.fromkeys(INDEX_FILES, 1)}
    ds.raw(7)  # shard 2
    assert rec_gets(s3_pack.faults) == {"faces-00002.rec": 1}
    ds.raw(8)
    ds.close()
    again = opened(s3_pack, tmp_path)  # the cache serves a second open: only the manifest read
    again.raw(7)
    assert dict(s3_pack.faults.gets) == {
        "faces.manifest.json": 2,
        **dict.fromkeys(INDEX_FILES, 1),
        "faces-00002.rec": 1,
    }


def mapping_of(array):
    while isinstance(array, np.ndarray):
        array = array.base
    array = getattr(array, "obj", array)
    return array if hasattr(array, "madvise") else None


def test_the_index_is_mapped_from_the_cache_and_a_pickled_copy_asks_the_store_for_nothing(
    remote_pack, tmp_path
):
    import pickle

    ds, local = opened(remote_pack, tmp_path), open_dataset(str(remote_pack.local))
    for array in (ds.offsets, ds.keys, ds.labels):
        assert mapping_of(array) is not None and not array.flags.writeable
    asked = dict(remote_pack.faults.gets)
    copy = pickle.loads(pickle.dumps(ds))  # as a spawned loader worker gets it
    assert type(copy) is RemoteDataset and copy.url == ds.url
    assert mapping_of(copy.keys) is not None
    assert [bytes(copy.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert copy.labels.tolist() == local.labels.tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 4
    assert dict(remote_pack.faults.gets) == {**asked, **rec_gets(remote_pack.faults)}
    assert set(rec_gets(remote_pack.faults)) == {f"faces-0000{i}.rec" for i in range(4)}


def _put(s3, pack, name, data):
    bucket = pack.url.split("/")[2]
    s3.client().put_object(Bucket=bucket, Key=f"packs/{name}", Body=data)
    return bucket


def test_an_index_array_whose_bytes_differ_from_the_manifest_is_refused_by_name(
    s3, s3_pack, tmp_path
):
    labels = np.load(s3_pack.folder / "faces.labels.npy")
    labels[5] = 7.0  # the same size, another label
    buffer = io.BytesIO()
    np.save(buffer, labels)
    bucket = _put(s3, s3_pack, "faces.labels.npy", buffer.getvalue())
    with pytest.raises(Exception) as caught:
        opened(s3_pack, tmp_path)
    assert type(caught.value).__name__ == "DigestMismatchError"
    message = str(caught.value)
    assert f"s3://{bucket}/packs/faces.labels.npy (index.labels of faces.manifest.json)" in message
    assert "xxh3-128" in message and "not used" in message
    folder = next((tmp_path / "cache" / "packs").iterdir())
    assert not (folder / "faces.labels.npy").exists()


def test_a_manifest_without_the_digest_of_an_index_array_is_refused_for_a_remote_pack(
    s3, s3_pack, tmp_path
):
    import json

    doc = json.loads(s3_pack.local.read_text())
    del doc["index"]["keys"]["xxh3_128"]
    _put(s3, s3_pack, "faces.manifest.json", json.dumps(doc).encode())
    with pytest.raises(Exception) as caught:
        opened(s3_pack, tmp_path)
    assert str(caught.value) == (
        f"{s3_pack.url}: the manifest gives no bytes or xxh3_128 of index.keys (faces.keys.npy); "
        "a remote pack needs both to check the download (write them with `rectool index`)"
    )
    assert "faces.keys.npy" not in s3_pack.faults.gets


def test_the_identity_names_are_fetched_only_when_asked_for(remote_pack, tmp_path):
    ds = opened(remote_pack, tmp_path)
    assert "faces.identities.json" not in remote_pack.faults.gets
    assert ds.identities == {0: "alice", 1: "bob", 2: "carol"}
    assert remote_pack.faults.gets["faces.identities.json"] == 1
    assert opened(remote_pack, tmp_path).identities == {0: "alice", 1: "bob", 2: "carol"}
    assert remote_pack.faults.gets["faces.identities.json"] == 1  # the cache's copy


def test_an_identities_file_whose_bytes_differ_is_refused_when_asked_for(s3, s3_pack, tmp_path):
    text = (s3_pack.folder / "faces.identities.json").read_bytes().replace(b"bob", b"eve")
    bucket = _put(s3, s3_pack, "faces.identities.json", text)
    ds = opened(s3_pack, tmp_path)  # not read at open: the samples read
    assert bytes(ds.raw(0)[0]) == bytes(open_dataset(str(s3_pack.local)).raw(0)[0])
    with pytest.raises(Exception) as caught:
        print(ds.identities)
    assert type(caught.value).__name__ == "DigestMismatchError"
    assert f"s3://{bucket}/packs/faces.identities.json (identities of " in str(caught.value)


def test_a_remote_insightface_pack_reads_its_identity_ranges_from_its_index(s3, tmp_path):
    from helpers.rec_files import make_pack

    pack = make_pack(tmp_path, layout="insightface")
    s3.upload_folder("faces-insightface", pack.manifest.parent, "packs/")
    url = f"s3://faces-insightface/packs/{pack.manifest.name}"
    ds = open_dataset(url, cache_dir=str(tmp_path / "cache"), retry=no_sleep()[0])
    local = open_dataset(str(pack.manifest))
    assert ds.layout == "insightface" and len(ds) == 12
    assert ds.identity_ranges.tolist() == [[0, 4], [4, 8], [8, 12]]
    assert [bytes(ds.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert ds.labels.tolist() == [0.0] * 4 + [1.0] * 4 + [2.0] * 4


def as_format_2(folder):
    """Rewrite the pack in `folder` as rectool wrote it before format 3: no binary index, the
    identity names in the manifest."""
    import json

    path = folder / "faces.manifest.json"
    doc = json.loads(path.read_text())
    doc["format_version"] = 2
    del doc["index"]
    doc["identities"] = json.loads((folder / "faces.identities.json").read_text())
    path.write_text(json.dumps(doc))
    for name in [*INDEX_FILES, "faces.identities.json"]:
        (folder / name).unlink()


def test_a_remote_pack_of_format_2_opens_with_its_index_built_in_memory(s3, tmp_path):
    import shutil

    from helpers.rec_files import make_pack

    pack = make_pack(tmp_path, shard_records=3)
    old = tmp_path / "old"
    shutil.copytree(pack.manifest.parent, old)
    as_format_2(old)
    s3.upload_folder("faces-format-2", old, "packs/")
    url = "s3://faces-format-2/packs/faces.manifest.json"
    ds = open_dataset(url, cache_dir=str(tmp_path / "cache"), retry=no_sleep()[0])
    local = open_dataset(str(pack.manifest))
    assert isinstance(ds, RemoteDataset) and not ds.indexed and len(ds) == 12
    assert [bytes(ds.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert ds.keys.tolist() == local.keys.tolist() == list(range(12))
    assert ds.labels.tolist() == local.labels.tolist()
    assert ds.identities == {0: "alice", 1: "bob", 2: "carol"}
    assert not [n for n in s3.faults.gets if n.endswith(".npy")]


@pytest.mark.parametrize("workers", [1, 3])
def test_a_loader_epoch_over_a_remote_pack_gives_every_sample_once_with_the_local_labels(
    remote_pack, tmp_path, workers
):
    ds, local = opened(remote_pack, tmp_path), open_dataset(str(remote_pack.local), decode="rgb")
    with Loader(ds, batch_size=5, workers=workers, seed=3, copy=True) as loader:
        order = loader.sampler.global_order()
        batches = list(loader)
    images = np.concatenate([b[0] for b in batches])
    labels = np.concatenate([b[1] for b in batches])
    assert sorted(order.tolist()) == list(range(12))
    assert labels.tolist() == [int(local.labels[i]) for i in order]
    assert all((images[k] == local[i][0]).all() for k, i in enumerate(order.tolist()))


def test_spawned_loader_workers_map_the_cached_index_without_asking_the_server(http_pack, tmp_path):
    ds = opened(http_pack, tmp_path)
    with Loader(ds, batch_size=4, workers=2, start_method="spawn", seed=1) as loader:
        labels = sorted(label for _, batch in loader for label in batch.tolist())
    assert labels == [0] * 4 + [1] * 4 + [2] * 4
    assert dict(http_pack.faults.gets) == {
        "faces.manifest.json": 1,
        **dict.fromkeys(INDEX_FILES, 1),
        **{f"faces-0000{i}.rec": 1 for i in range(4)},
    }


def test_the_loader_order_is_the_same_whatever_the_worker_count(s3_pack, tmp_path):
    ds = opened(s3_pack, tmp_path)
    seen = []
    for workers in (1, 2, 3):
        with Loader(ds, batch_size=4, workers=workers, seed=5) as loader:
            loader.set_epoch(2)
            seen.append([label for _, labels in loader for label in labels.tolist()])
    assert seen[0] == seen[1] == seen[2]


def test_a_shard_whose_bytes_differ_from_the_manifest_is_refused_by_name(s3, s3_pack, tmp_path):
    damaged = bytearray((s3_pack.folder / "faces-00002.rec").read_bytes())
    damaged[100] ^= 0xFF
    bucket = s3_pack.url.split("/")[2]
    s3.client().put_object(Bucket=bucket, Key="packs/faces-00002.rec", Body=bytes(damaged))
    ds = opened(s3_pack, tmp_path)
    ds.raw(0)
    with pytest.raises(Exception) as caught:
        ds.raw(7)
    message = str(caught.value)
    assert type(caught.value).__name__ == "DigestMismatchError"
    assert f"s3://{bucket}/packs/faces-00002.rec (shard 2 of faces.manifest.json)" in message
    assert "xxh3-128" in message and "not used" in message
    folder = next((tmp_path / "cache" / "packs").iterdir())
    names = {p.name for p in folder.iterdir()}
    assert "faces-00002.rec" not in names and not [n for n in names if n.endswith(".tmp")]


def test_500_twice_and_a_connection_dropped_mid_shard_are_survived(remote_pack, tmp_path):
    retry, sleeps = no_sleep()
    remote_pack.faults.plan("faces-00001.rec", "500", "500")
    remote_pack.faults.plan("faces-00002.rec", "drop")
    ds, local = opened(remote_pack, tmp_path, retry=retry), open_dataset(str(remote_pack.local))
    assert [bytes(ds.raw(i)[0]) for i in range(12)] == [bytes(local.raw(i)[0]) for i in range(12)]
    assert remote_pack.faults.gets["faces-00001.rec"] == 3
    # The dropped transfer was asked again from the byte that reached the cache: over HTTP the
    # half sent (urllib hands bytes over as they come); obstore buffers a 1 MiB chunk, more
    # than this small shard, so from its start.
    first, resumed = remote_pack.faults.ranges["faces-00002.rec"]
    size = (remote_pack.folder / "faces-00002.rec").stat().st_size
    assert first == 0 and (0 < resumed < size if remote_pack.url.startswith("http") else True)
    assert sleeps == [0.5, 1.0, 0.5]  # backoff doubling, then a fresh start for the next failure


def test_after_the_retries_the_error_names_the_url_and_shard_and_no_credential(
    remote_pack, tmp_path
):
    retry = Retry(attempts=3, sleep=no_wait)
    remote_pack.faults.plan("faces-00003.rec", *["500"] * 10)
    ds = opened(remote_pack, tmp_path, retry=retry)
    with pytest.raises(Exception) as caught:
        ds.raw(11)
    message = str(caught.value)
    assert "faces-00003.rec (shard 3 of faces.manifest.json)" in message
    assert "gave up after 3 tries" in message
    assert remote_pack.faults.gets["faces-00003.rec"] == 3
    assert "testing-secret-never-shown" not in message and "testing-key-id" not in message


def test_a_missing_manifest_is_one_clear_error(s3_pack, tmp_path):
    url = s3_pack.url.replace("faces.manifest.json", "other.manifest.json")
    with pytest.raises(Exception) as caught:
        open_dataset(url, cache_dir=str(tmp_path / "cache"))
    assert str(caught.value) == f"{url}: not found"


def test_remote_options_for_a_local_pack_are_refused(tmp_path):
    with pytest.raises(TypeError, match="cache_dir"):
        open_dataset(str(tmp_path / "faces"), cache_dir=str(tmp_path))


def test_urls_are_shown_without_their_credentials():
    from rectool.remote import safe_url

    assert safe_url("https://me:pw@host/p/x.json?X-Amz-Signature=abc") == "https://host/p/x.json"
