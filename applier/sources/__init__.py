"""Where pgoutput messages come from: a live slot (``sql_slot``) or a stored raw log (``rawlog``)."""
