"""`--dry-run` output: one write per batch of writes, so no log line can land inside it."""

import io

import yaml

from dra_driver.publish.diff import Create, Delete
from dra_driver.publish.dry_run import print_writes


class _Writes(io.StringIO):
    """A stream that counts its write calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def write(self, text: str) -> int:
        self.calls += 1
        return super().write(text)


def test_the_header_and_its_documents_go_out_in_one_write() -> None:
    body = {"metadata": {"generateName": "node-a-gpu-"}, "spec": {"nodeName": "node-a"}}
    stream = _Writes()

    print_writes(
        [Create(body=body), Delete(name="old", uid="u-1", resource_version="7", why="no longer planned")],
        stream,
    )

    assert stream.calls == 1
    header, rest = stream.getvalue().split("\n", 1)
    assert header == "# dry run: 2 ResourceSlice write(s) would be made"
    assert [document["verb"] for document in yaml.safe_load_all(rest)] == ["create", "delete"]


def test_no_writes_is_the_header_alone() -> None:
    stream = _Writes()

    print_writes([], stream)

    assert (stream.calls, stream.getvalue()) == (1, "# dry run: 0 ResourceSlice write(s) would be made\n")
