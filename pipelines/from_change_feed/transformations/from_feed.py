"""The mirror of one table rebuilt from applier's change feed, two ways.

``acct_latest`` (a materialized view) runs anywhere: per key the last change by (commit LSN, ordinal),
dropped when it is a delete. ``acct_cdc`` is the same with ``create_auto_cdc_flow`` (a streaming table
kept up to date incrementally), for platforms whose Delta tables support row-level operations.
"""

from pyspark import pipelines as dp
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

spark = SparkSession.active()
FEED = spark.conf.get("applier.feed")
KEYS = [k.strip() for k in spark.conf.get("applier.keys", "id").split(",")]
CHANGE_COLUMNS = ["__op", "__commit_lsn", "__ordinal", "__commit_time"]


@dp.materialized_view(format="delta")
def acct_latest() -> DataFrame:
    feed = spark.read.format("delta").load(FEED)
    order = Window.partitionBy(*KEYS).orderBy(F.col("__commit_lsn").desc(), F.col("__ordinal").desc())
    latest = feed.withColumn("__n", F.row_number().over(order)).filter("__n = 1")
    return latest.filter("__op <> 'D'").drop("__n", *CHANGE_COLUMNS)


if spark.conf.get("applier.auto_cdc", "false") == "true":

    @dp.temporary_view
    def acct_changes() -> DataFrame:
        return spark.readStream.format("delta").load(FEED)

    dp.create_streaming_table("acct_cdc", format="delta")
    dp.create_auto_cdc_flow(target="acct_cdc", source="acct_changes", keys=KEYS,
                            sequence_by="struct(__commit_lsn, __ordinal)", apply_as_deletes="__op = 'D'",
                            except_column_list=CHANGE_COLUMNS)
