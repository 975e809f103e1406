"""Decoding and folding on Spark's executors: a stored raw log (replay) or a live slot's backlog
(applier.drivers.backlog).

The driver path (applier.drivers.replay) sends every message through one Python thread. Here:

1. **Survey** (driver, one pass over the log's headers): the order check read_raw_log makes anyway,
   the catalog timeline (every Relation and Type message, decoded and applied in order) and the
   places where no transaction is open: no regular or two-phase transaction between its Begin and
   its Commit/Prepare, no streamed transaction between its first Stream Start and its Stream
   Commit/Abort, no prepared transaction waiting for its Commit/Rollback Prepared. The log is cut
   there into ranges of about ``partition_messages`` messages, each with the catalog as it stood at
   its start. A range therefore holds whole transactions, streamed and two-phase ones included.
2. **Fold** (executors, one task per range): the same feeder as the driver path (decode, assemble,
   convert, origin filter, configured skips) and the same per-table fold (applier.sink.fold's
   ``table_spec`` and ``fold_table``), leaving out what a table already applied (its end LSN, read
   by the driver before the run), gives per table one TablePlan for the range. The range is in
   memory whole, so the feeder takes its plain transactions (Begin, rows, Commit) the short way,
   without the assembler's buffer (``TransactionFeeder.feed_range``).
3. **Combine and commit** (driver, ranges in log order): consecutive ranges' plans are combined
   (applier.sink.combine, equal to folding the ranges in one pass) within ``apply.max_group_rows``,
   ``max_group_transactions`` and ``max_group_bytes_mb`` (a group is committed before a range that would
   take it past one: ``GroupLimits``; the survey cuts no range past them, but for a transaction larger
   alone, or what commits while a streamed or prepared one is open), then committed exactly as a group of the
   driver path is (same engines, same ``txn`` tag: the end LSN of the group's last transaction), so
   a crash anywhere and a re-run are exact.

What it does not do, it hands to the driver path, which is exact for everything: a log (or the
rest of one) with a range that failed on an executor (bad bytes, a value that does not convert: the
driver path then applies the transactions before the bad one and stops with the precise error), the
tail after the last place where nothing is open (a prepared transaction the log leaves waiting is
staged by the driver path, as always), and whole logs that need what only the driver path has:
history or change-feed tables (they need every change, not a fold), ``grouping: transaction``,
``--dry-run``, prepared transactions staged by an earlier run, or files whose rows are not in log
order (``eligibility`` says which).

The modules, one job each: ``ranges`` (what a range is and carries), ``survey`` (step 1),
``task`` (step 2, what runs on an executor), ``scheduler`` (step 2 from the driver, and the group
of folds waiting for its commit), ``commit`` (step 3), ``eligibility`` (which logs and settings
may come here).
"""
