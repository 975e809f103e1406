"""Where bytes live: local directories and object stores (s3://, gs://, abfss://), one vocabulary.

Why a package of its own: a target, a raw log and a state directory may each be a local path or an
object-store URI, and every module that builds a path (the table layout, the state directory, the
lock) must join, list and write them the same way. delta-rs and the lock objects both go through
Rust's ``object_store`` (delta-rs inside, ``obstore`` here), which read the cloud's standard
environment, and take a target's explicit ``storage_options`` from ``options`` (which also spells
them for pyarrow and Spark), so every engine reaches the same store with the same credentials.
"""

from applier.storage.location import OBJECT_SCHEMES, is_object_store, join, scheme_of

__all__ = ["OBJECT_SCHEMES", "is_object_store", "join", "scheme_of"]
