"""Moving channels between tuples: promote through the channel's gates (``gates/``, one module
per gate), rollback to a tuple the channel served, the single-node rollback, and the approval
requests for either move. Each move is planned, then acted: the plan reads every record and runs
every check, raising a named error before anything is written or any cluster is touched; only the
act writes. The records it reads and writes are ``releases/``'s and ``policy/``'s.
"""
