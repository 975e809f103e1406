"""Built-in type OIDs (pg_type.dat) and the names 'Y' messages use for them."""

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID = 16, 17, 18, 19, 20, 21, 23, 25, 26
JSON, XML, FLOAT4, FLOAT8, MONEY = 114, 142, 700, 701, 790
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ, INTERVAL, TIMETZ = 1042, 1043, 1082, 1083, 1114, 1184, 1186, 1266
NUMERIC, UUID, JSONB = 1700, 2950, 3802

#: array type OID -> element type OID
ARRAY_ELEMENT: dict[int, int] = {
    1000: BOOL, 1001: BYTEA, 1002: CHAR, 1003: NAME, 1016: INT8, 1005: INT2, 1007: INT4, 1009: TEXT,
    1028: OID, 199: JSON, 1021: FLOAT4, 1022: FLOAT8, 1014: BPCHAR, 1015: VARCHAR, 1182: DATE,
    1183: TIME, 1115: TIMESTAMP, 1185: TIMESTAMPTZ, 1187: INTERVAL, 1270: TIMETZ, 1231: NUMERIC,
    2951: UUID, 3807: JSONB,
}

#: pg_catalog type names -> OID (a domain's 'Y' message carries its base type's name).
BUILTIN_BY_NAME: dict[str, int] = {
    "bool": BOOL, "bytea": BYTEA, "char": CHAR, "name": NAME, "int8": INT8, "int2": INT2, "int4": INT4,
    "text": TEXT, "oid": OID, "json": JSON, "float4": FLOAT4, "float8": FLOAT8, "bpchar": BPCHAR,
    "varchar": VARCHAR, "date": DATE, "time": TIME, "timestamp": TIMESTAMP, "timestamptz": TIMESTAMPTZ,
    "interval": INTERVAL, "timetz": TIMETZ, "numeric": NUMERIC, "uuid": UUID, "jsonb": JSONB,
}

#: pg_catalog array type names ('_int4') -> array OID, for domains over built-in arrays.
BUILTIN_ARRAY_BY_NAME: dict[str, int] = {
    "_" + name: arr for arr, elem in ARRAY_ELEMENT.items() for name, oid in BUILTIN_BY_NAME.items() if oid == elem
}
