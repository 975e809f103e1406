"""Drivers: where raw messages come from and how a position is confirmed, around the one apply loop.

``replay`` (a stored raw log), ``mirror`` (a live slot, after the initial copy), ``capture`` (a slot
into a raw log, no apply) and ``streaming`` (Structured Streaming's foreachBatch). Each supplies raw
messages and a confirm function; what happens to a transaction is decided in ``applier.loop``."""
