"""The release records and the moves that write them: release tuples (bound once, re-derived on
every read), channels (pointers moved by compare-and-swap, with an append-only history), the
evidence recorded beside a tuple for the gates (reviews, evaluations, traffic analyses,
preflights, image scans, signatures), reviewing, scanning and signing after the fact, and
retention (gc) with its tombstones and pins. Records are created once or swapped, never edited;
it runs no gate (``promotion/gates/`` reads what it records) and talks to no cluster.
"""
