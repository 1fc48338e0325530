"""What an operator sees and is told: one progress reporter for long phases (a bar, periodic
log lines as text or JSON, or nothing), the ``k3artifacts`` logger on stderr, and the pipeline's
notification vocabulary. It only shows and names what happened: the flows emit the
notifications, and nothing here decides or changes anything.
"""
