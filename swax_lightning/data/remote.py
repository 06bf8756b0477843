"""Shard folders in S3 (or any S3-compatible store): prepared once, uploaded, streamed by every node.

A `data_dir` such as `s3://bucket/corpus-16k` holds what a local one holds (meta.json, `train/`, `val/`, `test/`
with litdata's index.json and chunk files). Training never reads it in place: litdata's StreamingDataset downloads
the chunks it needs into a local cache folder as it reads them.

Decisions:
- The remote folder is mirrored by a local cache folder. Preparation writes the shards there with the same code as
  for a local data_dir (so remote shards are byte for byte local ones), checks them, then uploads them. Setup fetches
  meta.json and each split's index.json into the cache, so every check that reads those files (settings, tokenizer,
  one batch, token counts) is the local one.
- meta.json is uploaded last: a remote folder is complete exactly when it has one, as a local folder is. An
  interrupted upload leaves files without it, which the next preparation refuses to write over (as it refuses a
  local folder without meta.json), naming the folder.
- Sizes are checked against one listing of the folder (a request per 1,000 objects; a 150B-token corpus has about
  36,000 chunks): a missing or truncated chunk is named before the first step. Content checksums are compared on the
  local copy right before upload, not at every start (that would read the whole corpus from S3 on each run).
- Transfers go through litdata's own S3 client, so `storage_options` (endpoint_url, credentials, region) mean what
  they mean to StreamingDataset. Files fetched into the cache are written to a temporary name and renamed: ranks of
  one node fetch the same files at once.
"""
from __future__ import annotations

from pathlib import Path

from swax_lightning.core.atomic import written_atomically
from swax_lightning.data.shards import check_listed_sizes

REMOTE_SCHEMES = ("s3://",)
OTHER_SCHEMES = ("gs://", "r2://", "azure://", "hf://", "local:")  # litdata's, not supported here (yet)


def remote_url(data_dir: str | None) -> str | None:
    """The s3:// URL a data_dir names, None for a local folder; the schemes litdata knows but this module does not
    are refused by name."""
    text = str(data_dir or "")
    if text.startswith(OTHER_SCHEMES):
        raise ValueError(f"data.data_dir {text!r}: only s3:// remote folders are supported (S3-compatible stores "
                         f"through data.storage_options.endpoint_url)")
    return text.rstrip("/") if text.startswith(REMOTE_SCHEMES) else None


def default_cache_dir(url: str) -> Path:
    return Path("data/cache") / url.removeprefix("s3://").rstrip("/")


class RemoteFolder:
    """One s3:// folder of shards, read and written with litdata's S3 client."""

    def __init__(self, url: str, storage_options: dict | None = None):
        from litdata.streaming.client import S3Client

        self.url = url.rstrip("/")
        self.bucket, _, self.prefix = self.url.removeprefix("s3://").partition("/")
        if not self.bucket:
            raise ValueError(f"data.data_dir {url!r} names no bucket (expected s3://bucket/folder)")
        self.storage_options = dict(storage_options or {})
        self._client = S3Client(storage_options=self.storage_options)

    @property
    def _s3(self):
        return self._client.client  # boto3's S3 client, configured from storage_options (credentials refreshed)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def sizes(self) -> dict[str, int]:
        """{relative name: bytes} of every object under the folder."""
        out, start = {}, len(self._key(""))
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self._key("")):
            out.update({item["Key"][start:]: item["Size"] for item in page.get("Contents", [])})
        return out

    def is_empty(self) -> bool:
        return self._s3.list_objects_v2(Bucket=self.bucket, Prefix=self._key(""), MaxKeys=1).get("KeyCount", 0) == 0

    def exists(self, name: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._s3.head_object(Bucket=self.bucket, Key=self._key(name))
        except ClientError as err:
            if err.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise
        return True

    def fetch(self, name: str, local: Path) -> None:
        """Downloads one object to `local`, through a temporary name (no reader sees half a file)."""
        with written_atomically(local) as tmp, open(tmp, "wb") as f:
            self._s3.download_fileobj(self.bucket, self._key(name), f)

    def upload(self, root: Path, names: list[str]) -> None:
        """Uploads root/name for each name, then root/meta.json last (it marks the folder complete)."""
        for name in [*names, "meta.json"]:
            self._s3.upload_file(str(root / name), self.bucket, self._key(name))

    def check_sizes(self, indexes: dict[str, dict]) -> None:
        """Every chunk each split's index lists ({split: index}) exists with the size the index records."""
        sizes = self.sizes()
        for split, index in indexes.items():
            prefix = f"{split}/"
            found = {name.removeprefix(prefix): size for name, size in sizes.items() if name.startswith(prefix)}
            check_listed_sizes(index, found, f"{self.url}/{split}")
