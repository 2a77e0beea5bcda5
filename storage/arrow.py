"""The object store as pyarrow sees it, for the Ray libraries that do their own I/O through pyarrow
(Ray Data's `read_parquet` of tokenized shards, Ray Train's run storage).

`arrow_root(store_spec)` gives a pyarrow filesystem and the path of the store's root on it, so the
object under key `k` is `f"{root}/{k}"`: the same bytes `open_object_store(*store_spec)` reads.
S3 credentials come from the AWS SDK's usual chain (environment, profile, instance role), as
boto3's do in storage/_s3.py: every node finds its own.

Writers get `arrow_location`, whose S3 filesystem creates no directories. pyarrow's S3 `create_dir`
writes an empty `<dir>/` marker object for the directory and each parent (`runs/`, `runs/<job>/`,
...): keys no store function accepts, so nothing would ever delete them. S3 needs no parent to
write an object under, so creating a directory there is a no-op; a local store's directories are
real and are created.
"""

from __future__ import annotations

from urllib.parse import unquote, urlparse

import pyarrow.fs as pafs

from storage.objects import check_prefix, check_storage_url


def arrow_root(store_spec: tuple) -> tuple[pafs.FileSystem, str]:
    """`(filesystem, root)` of the store `open_object_store(*store_spec)` opens."""
    url, endpoint, region = store_spec
    if check_storage_url(url) == "file":
        return pafs.LocalFileSystem(), unquote(urlparse(url).path).rstrip("/")
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    root = f"{bucket}/{prefix.strip('/')}" if prefix.strip("/") else bucket
    return pafs.S3FileSystem(endpoint_override=endpoint, region=region), root


def arrow_location(store_spec: tuple, prefix: str) -> tuple[pafs.FileSystem, str]:
    """`(filesystem, path)` of the directory-like key `prefix` (`runs/<job>/train/`), for a writer."""
    fs, root = arrow_root(store_spec)
    if isinstance(fs, pafs.S3FileSystem):
        fs = pafs.PyFileSystem(_NoDirectories(fs))
    return fs, f"{root}/{check_prefix(prefix).strip('/')}"


class _NoDirectories(pafs.FileSystemHandler):
    """An S3 filesystem whose `create_dir` writes no marker; everything else is pyarrow's own."""

    def __init__(self, fs: pafs.S3FileSystem):
        self.fs = fs

    def __eq__(self, other):
        return isinstance(other, _NoDirectories) and self.fs.equals(other.fs)

    def __ne__(self, other):
        return not self == other

    def get_type_name(self):
        return "s3-no-directories"

    def normalize_path(self, path):
        return self.fs.normalize_path(path)

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        pass

    def delete_dir(self, path):
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        self.fs.delete_dir_contents("/", accept_root_dir=True)

    def delete_file(self, path):
        self.fs.delete_file(path)

    def move(self, src, dest):
        self.fs.move(src, dest)

    def copy_file(self, src, dest):
        self.fs.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        return self.fs.open_input_file(path)

    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)
