"""Process-level helpers the stages share: the cache directory, crash points for tests, the apply
loop's garbage-collection policy and fast constructors for per-change records."""
