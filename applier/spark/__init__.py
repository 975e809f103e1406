"""Spark wiring: the Delta jars and the SparkSession. The only package that knows how Spark is started."""
