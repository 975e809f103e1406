"""PostgreSQL values to Python values, and PostgreSQL types to Spark types (see docs/type-mapping.md)."""

from applier.values.convert import UNCHANGED_TOAST, RowConverter, convert_value, spark_schema_for, spark_type_for
from applier.values.registry import TypeHandler, handler_for
from applier.values.special import SpecialValuePolicy, Unrepresentable

__all__ = ["UNCHANGED_TOAST", "RowConverter", "SpecialValuePolicy", "TypeHandler", "Unrepresentable",
           "convert_value", "handler_for", "spark_schema_for", "spark_type_for"]
