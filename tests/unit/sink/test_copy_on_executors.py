"""The pieces of the copy on Spark's executors that need no server: the statistics of the files its
tasks write (readers skip files by them, so a wrong bound loses rows from a query), the errors that
travel from a task to the driver whole, and where ``snapshot.on_executors`` sends a table."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime

import pyarrow as pa
import pytest

from applier.config import SnapshotSettings
from applier.drivers.copy_tasks import ChunkNeedsDriver, carried, carried_error
from applier.errors import ValueConversionError
from applier.sink.copyfiles import file_stats


def test_file_stats_bound_every_value_and_count_nulls_of_columns_that_are_not_nested():
    piece = pa.table({
        "id": pa.array([5, -3, 9], pa.int64()),
        "s": pa.array([32767, None, -32768], pa.int16()),
        "d": pa.array([date(1, 1, 1), date(2020, 5, 6), None]),
        "t": pa.array(["é", "", None]),
        "f": pa.array([float("nan"), 1.0, None]),  # floats: no bounds (NaN), a NULL count
        "l": pa.array([[1], None, []], pa.list_(pa.int32())),  # nested: nothing
        "n": pa.array([None, None, None], pa.int32()),  # all NULL: no bounds
    })
    stats = json.loads(file_stats(piece))
    assert stats["numRecords"] == 3
    assert stats["minValues"] == {"id": -3, "s": -32768, "d": "0001-01-01", "t": ""}
    assert stats["maxValues"] == {"id": 9, "s": 32767, "d": "2020-05-06", "t": "é"}
    assert stats["nullCount"] == {"id": 0, "s": 1, "d": 1, "t": 1, "f": 1, "n": 3}


def test_file_stats_bound_timestamps_to_the_millisecond_and_leave_out_what_python_cannot_hold():
    utc = UTC
    piece = pa.table({
        "tz": pa.array([datetime(2021, 3, 4, 5, 6, 8, 999999, tzinfo=utc), datetime(999, 1, 2, tzinfo=utc)],
                       pa.timestamp("us", tz="UTC")),
        "ntz": pa.array([datetime(2021, 3, 4, 5, 6, 7, 123456), None], pa.timestamp("us")),
        "far": pa.array([-(2 ** 62), 2 ** 62], pa.timestamp("us")),  # years Python's datetime cannot hold
    })
    stats = json.loads(file_stats(piece))
    # as delta-rs writes them: cut (not rounded) to the millisecond, four-digit years
    assert stats["minValues"]["tz"] == "0999-01-02T00:00:00.000Z"
    assert stats["maxValues"]["tz"] == "2021-03-04T05:06:08.999Z"
    assert stats["minValues"]["ntz"] == stats["maxValues"]["ntz"] == "2021-03-04 05:06:07.123"
    assert "far" not in stats["minValues"] and "far" not in stats["maxValues"] and stats["nullCount"]["far"] == 0


def test_file_stats_of_an_empty_piece_count_no_rows():
    stats = json.loads(file_stats(pa.schema([pa.field("id", pa.int64())]).empty_table()))
    assert stats == {"numRecords": 0, "minValues": {}, "maxValues": {}, "nullCount": {"id": 0}}


def test_an_error_raised_in_a_task_reaches_the_driver_with_its_class_and_context():
    error = ValueConversionError("numeric NaN has no DECIMAL value: set apply.special_values", column="n",
                                 relation="public.t")
    text = f"org.apache.spark.SparkException: Job aborted ... {carried(error)}\n\tat org.apache..."
    back = carried_error(text)
    assert isinstance(back, ValueConversionError) and back.column == "n" and back.relation == "public.t"
    assert str(back) == str(error)
    assert isinstance(carried_error(str(carried(ChunkNeedsDriver("x", table="public.t")))), ChunkNeedsDriver)
    assert carried_error("py4j.protocol.Py4JJavaError: connection refused") is None


@pytest.mark.parametrize(("setting", "local", "fewest"), [
    ("auto", True, None), ("auto", False, 2), (True, True, 1), (True, False, 1), (False, False, None)])
def test_on_executors_sends_tables_of_enough_chunks_to_the_executors(setting, local, fewest):
    assert SnapshotSettings(on_executors=setting).executor_chunks(local) == fewest


def test_on_executors_takes_booleans_and_auto_only():
    assert SnapshotSettings.model_validate({"on_executors": "true"}).on_executors is True
    assert SnapshotSettings.model_validate({}).on_executors == "auto"
    with pytest.raises(ValueError, match="on_executors"):
        SnapshotSettings.model_validate({"on_executors": "sometimes"})
