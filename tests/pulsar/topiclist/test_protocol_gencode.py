"""The committed protobuf module is what its .proto generates with the
pinned grpcio-tools (pyproject's `codegen` group), so a pure install needs no
compiler and the .proto stays the source of truth."""

from __future__ import annotations

from pathlib import Path

import pytest

import pylimiter.pulsar.topiclist as topiclist

HERE = Path(topiclist.__file__).resolve().parent
PROTO = HERE / "pulsar_topiclist.proto"


def test_committed_gencode_matches_the_proto(tmp_path):
    protoc = pytest.importorskip("grpc_tools.protoc")
    if not PROTO.exists():
        pytest.skip("the .proto is not installed here")
    rc = protoc.main(["protoc", f"-I{HERE}", f"--python_out={tmp_path}", str(PROTO)])
    assert rc == 0
    fresh = (tmp_path / "pulsar_topiclist_pb2.py").read_text()
    committed = (HERE / "pulsar_topiclist_pb2.py").read_text()
    assert fresh == committed, "run `make proto` and commit the result"
