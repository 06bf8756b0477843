"""An s3:// data_dir, against a local S3 server (moto): the shards a node streams from the bucket are the local ones,
training from the bucket trains the same model, and a missing, truncated or half-uploaded folder is named at start."""
import json
import re

import boto3
import pytest
import torch
from litdata.streaming import downloader
from test_data import SEQ, source  # noqa: F401  (the module's small source folder)

from swax_lightning.data.datamodule import TextDataModule

ThreadedMotoServer = pytest.importorskip("moto.server", reason="moto: bash setup.sh installs it").ThreadedMotoServer


@pytest.fixture(scope="module")
def endpoint():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(endpoint, monkeypatch, request):
    """A fresh bucket on the local server; returns its s3:// URL."""
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    # The local server speaks plain http; litdata's chunk downloads (obstore) accept only https unless told.
    monkeypatch.setitem(downloader._OBSTORE_CLIENT_OPTIONS, "allow_http", "true")
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:60].strip("-")  # S3's bucket name rules
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=name)
    return f"s3://{name}"


def _module(src, endpoint, data_dir, cache_dir, **overrides):
    settings = dict(source=src and str(src), data_dir=data_dir, cache_dir=str(cache_dir), seq_len=SEQ,
                    batch_size=4, val_fraction=0.2, test_fraction=0.2, storage_options={"endpoint_url": endpoint})
    return TextDataModule(**settings | overrides)


def _objects(endpoint, url):
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    s3 = boto3.client("s3", endpoint_url=endpoint)
    return {o["Key"].removeprefix(prefix + "/"): s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read()
            for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix + "/").get("Contents", [])}


def test_a_node_streams_from_the_bucket_exactly_the_local_shards(source, endpoint, bucket, tmp_path):  # noqa: F811
    """Rank 0 prepares and uploads; another node, with only the URL and an empty cache, reads every split's blocks
    and the training loader's batches equal to those of the same data prepared in a local folder."""
    url = f"{bucket}/corpus"
    _module(source, endpoint, url, tmp_path / "cache-rank0").prepare_data()
    uploaded = _objects(endpoint, url)
    meta = json.loads(uploaded["meta.json"])
    assert set(uploaded) == set(meta["sha256"]) | {"meta.json"}

    node = _module(None, endpoint, url, tmp_path / "cache-node1")
    node.prepare_data()  # the bucket has the shards: nothing to do
    node.setup("fit")
    local = TextDataModule(source=str(source), data_dir=str(tmp_path / "local"), seq_len=SEQ, batch_size=4,
                           val_fraction=0.2, test_fraction=0.2)
    local.prepare_data()
    local.setup("fit")
    for split in ("train", "val", "test"):
        remote_blocks, local_blocks = node.blocks(split, SEQ + 1), local.blocks(split, SEQ + 1)
        assert len(remote_blocks) == len(local_blocks) > 0
        assert all(torch.equal(torch.as_tensor(remote_blocks[i]), torch.as_tensor(local_blocks[i]))
                   for i in range(len(local_blocks)))
    batches = lambda dm: [b.clone() for b in dm.train_dataloader()]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(batches(node), batches(local), strict=True))
    assert list((tmp_path / "cache-node1/train").glob("chunk-*.bin"))  # streamed through the cache


def test_fit_from_the_bucket_trains_the_same_model_as_from_a_local_folder(endpoint, bucket, tmp_path):
    """`main.py fit` with data.data_dir s3://... (prepared and uploaded by the run) ends with the weights of the same
    run on a local data_dir."""
    from main import main

    def fit(name, *data):
        main(["fit", "--config", "configs/tiny.yaml", *data, "--trainer.logger.init_args.save_dir",
              str(tmp_path / name), "--trainer.enable_progress_bar", "false", "--trainer.max_steps", "3",
              "--trainer.limit_val_batches", "1", "--data.batch_size", "2"])
        return torch.load(tmp_path / name / "tiny/w64/checkpoints/last.ckpt", weights_only=False)["state_dict"]

    remote = fit("s3", "--data.data_dir", f"{bucket}/tiny", "--data.cache_dir", str(tmp_path / "cache"),
                 "--data.storage_options", json.dumps({"endpoint_url": endpoint}))
    local = fit("local", "--data.data_dir", str(tmp_path / "data"))
    assert remote.keys() == local.keys()
    assert all(torch.equal(remote[k], local[k]) for k in local)
    assert "meta.json" in _objects(endpoint, f"{bucket}/tiny")


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_a_missing_or_truncated_chunk_in_the_bucket_is_named(source, endpoint, bucket, tmp_path, damage):  # noqa: F811
    url = f"{bucket}/corpus"
    _module(source, endpoint, url, tmp_path / "cache").prepare_data()
    name, s3 = bucket.removeprefix("s3://"), boto3.client("s3", endpoint_url=endpoint)
    key = "corpus/train/chunk-0-0.bin"
    if damage == "delete":
        s3.delete_object(Bucket=name, Key=key)
    else:
        s3.put_object(Bucket=name, Key=key, Body=b"\0" * 8)
    node = _module(None, endpoint, url, tmp_path / "other-cache")
    with pytest.raises((FileNotFoundError, ValueError), match=f"shard (missing|corrupt): {url}/train/chunk-0-0.bin"):
        node.setup("fit")


def test_an_interrupted_upload_is_never_taken_for_shards(source, endpoint, bucket, tmp_path, monkeypatch):  # noqa: F811
    """The upload stops after two files: the bucket holds no meta.json, so a node refuses to train from it, and the
    next preparation refuses to write over it, each naming the folder."""
    import swax_lightning.data.remote as remote

    url, sent = f"{bucket}/corpus", []
    real_upload = remote.RemoteFolder.upload

    def two_then_fail(self, root, names):
        sent.extend(names[:2])
        for name in sent:
            self._s3.upload_file(str(root / name), self.bucket, self._key(name))
        raise ConnectionError("network down")

    monkeypatch.setattr(remote.RemoteFolder, "upload", two_then_fail)
    with pytest.raises(ConnectionError):
        _module(source, endpoint, url, tmp_path / "cache").prepare_data()
    monkeypatch.setattr(remote.RemoteFolder, "upload", real_upload)
    assert set(_objects(endpoint, url)) == set(sent)
    with pytest.raises(FileNotFoundError, match=f"{url}/meta.json missing"):
        _module(None, endpoint, url, tmp_path / "node").setup("fit")
    with pytest.raises(FileExistsError, match=f"{url} holds files but no meta.json"):
        _module(source, endpoint, url, tmp_path / "cache").prepare_data()


def test_an_empty_bucket_folder_without_source_is_named(endpoint, bucket, tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no shards in {bucket}/nothing"):
        _module(None, endpoint, f"{bucket}/nothing", tmp_path / "cache").prepare_data()


def test_other_settings_than_the_bucket_holds_are_refused(source, endpoint, bucket, tmp_path):  # noqa: F811
    url = f"{bucket}/corpus"
    _module(source, endpoint, url, tmp_path / "cache").prepare_data()
    with pytest.raises(ValueError, match=f"{url}/meta.json was written for other settings.*val_fraction"):
        _module(source, endpoint, url, tmp_path / "cache2", val_fraction=0.3).setup("fit")


@pytest.mark.parametrize("data_dir, field", [("gs://b/x", "only s3:// remote folders"),
                                             ("data/local", "cache_dir is for an s3:// data_dir")])
def test_unsupported_locations_are_refused_by_field(tmp_path, data_dir, field):
    with pytest.raises(ValueError, match=field):
        TextDataModule(source=None, data_dir=data_dir, cache_dir=str(tmp_path))
