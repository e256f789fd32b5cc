"""Paths through ``pyarrow.fs``: a ``file://`` URI, an explicit ``LocalFileSystem`` or a
``SubTreeFileSystem`` over the local disk give exactly the rows of the plain path (the
``log_file`` column included: a local file is shown by its absolute path however it was
named), in pure Python and under Spark; a file system that is not local shows its files
as URIs."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.spark import NoLogsError, find_logs, read_rows
from ambrosia_py.spark.fs import resolve
from tests.test_spark_rows import make_data_dir, normal, reference_rows

pafs = pytest.importorskip("pyarrow.fs")


def test_uris_and_explicit_file_systems_give_the_plain_paths_rows(tmp_path: Path) -> None:
    root = make_data_dir(tmp_path / "data")
    plain = list(read_rows(root, split_bytes=600))
    assert normal(plain) == reference_rows(root)
    assert list(read_rows(root.as_uri(), split_bytes=600)) == plain
    assert list(read_rows(str(root), filesystem=pafs.LocalFileSystem(), split_bytes=600)) == plain
    subtree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    assert list(read_rows("data", filesystem=subtree, split_bytes=600)) == plain
    # An instance's directory and one log file, by URI; record rows too.
    one = root / "alpha_0" / "serverlog2"
    assert list(read_rows(one.as_uri())) == list(read_rows(one))
    assert list(read_rows(f"{(root / 'beta_2').as_uri()}/", level="record")) == list(
        read_rows(root / "beta_2", level="record")
    )
    nested = pafs.SubTreeFileSystem("data", subtree)
    assert [log.path for log in find_logs("alpha_0", nested)] == [
        str(root / "alpha_0" / f"serverlog{n}") for n in (1, 2, 3)
    ]


def test_a_missing_path_is_named_as_given(tmp_path: Path) -> None:
    with pytest.raises(NoLogsError, match="no such file or directory"):
        find_logs((tmp_path / "nowhere").as_uri())
    with pytest.raises(NoLogsError, match=str(tmp_path / "empty")):
        (tmp_path / "empty").mkdir()
        find_logs(f"file://{tmp_path}/empty")


def test_locations_pickle_and_other_file_systems_show_uris(tmp_path: Path) -> None:
    """What travels to Spark's workers is a picklable location; a file on a file system
    that is not local is shown as a URI (here a subtree of a mock file system)."""
    mock = pafs._MockFileSystem()
    mock.create_dir("data/svc_0")
    data = make_data_dir(tmp_path / "data")
    with mock.open_output_stream("data/svc_0/serverlog1") as out:
        out.write((data / "beta_2" / "serverlog1").read_bytes())
    logs = find_logs("data", mock)
    assert [(log.path, log.instance, log.version) for log in logs] == [
        ("mock://data/svc_0/serverlog1", "svc", 0)
    ]
    rows = normal(read_rows("data", filesystem=mock))
    renamed = {"log_file": "mock://data/svc_0/serverlog1", "instance": "svc", "version": 0}
    expected = [
        {**r, **renamed, "destination": "svc" if r["destination"] == "beta" else r["destination"]}
        for r in reference_rows(data)
        if r["instance"] == "beta"
    ]
    assert rows == expected
    where = resolve(data.as_uri())
    again = pickle.loads(pickle.dumps(where))
    assert again == where and again.shown == str(data)


def test_spark_reads_file_uris(spark: Any, tmp_path: Path) -> None:
    from tests.test_spark_source import collect, load

    root = make_data_dir(tmp_path / "data")
    by_uri = spark.read.format("ambrosia").option("split_bytes", "600").load(root.as_uri())
    assert by_uri.rdd.getNumPartitions() > 4
    assert collect(by_uri) == collect(load(spark, root, split_bytes="600"))


def test_the_stream_reader_follows_a_uri_as_a_plain_path(tmp_path: Path) -> None:
    """Offsets name each log by its path under the data dir, however the dir was named;
    the micro-batch's rows are the batch rows (here called without Spark)."""
    pytest.importorskip("pyspark")
    from ambrosia_py.spark.source import AmbrosiaStreamReader, Options

    root = make_data_dir(tmp_path / "data")
    ends = []
    for path in (str(root), root.as_uri()):
        reader = AmbrosiaStreamReader(Options.parse({"path": path}))
        start = reader.initialOffset()
        end = reader.latestOffset(start, None)
        batches = [b for p in reader.partitions(start, end) for b in reader.read(p)]
        assert sum(b.num_rows for b in batches) == len(reference_rows(root))
        ends.append(end)
    assert ends[0] == ends[1]
    assert sorted(ends[0]["files"]) == [
        "alpha_0/serverlog1", "alpha_0/serverlog2", "alpha_0/serverlog3", "beta_2/serverlog1"
    ]  # fmt: skip
