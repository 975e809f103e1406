"""PostgreSQL values to Python values, and PostgreSQL types to Arrow column types (see docs/type-mapping.md)."""

from applier.values.convert import UNCHANGED_TOAST, RowConverter, arrow_schema_for, arrow_type_for, convert_value
from applier.values.registry import TypeHandler, handler_for
from applier.values.special import SpecialValuePolicy, Unrepresentable

__all__ = ["UNCHANGED_TOAST", "RowConverter", "SpecialValuePolicy", "TypeHandler", "Unrepresentable",
           "convert_value", "handler_for", "arrow_schema_for", "arrow_type_for"]
