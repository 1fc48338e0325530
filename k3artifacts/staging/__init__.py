"""Staging: a Hub revision becomes a verified, published revision in a store, through one
engine whatever runs it (a thread pool, Prefect tasks, workers on other machines): the listing
rules, the plan (download, reuse, present), the Hub client and the resumable download hashed as
bytes arrive, the quarantine, the per-file checks, license capture, the runners, repair. Nothing
reaches readers before it is verified and the manifest is written last; staging never writes
release records (tuples, channels) and shows nothing itself: observers subscribe to its events.
"""
