"""Errors cross process boundaries intact (a Dask worker's task exception is pickled)."""

from __future__ import annotations

import pickle

from k3artifacts.errors import Refusal, ReleaseRefused, Unavailable


def test_refusals_survive_pickling():
    refusal = Refusal("model.safetensors", "sha256", "mismatch")
    again = pickle.loads(pickle.dumps(ReleaseRefused([refusal])))
    assert isinstance(again, ReleaseRefused) and str(again) == str(ReleaseRefused([refusal]))
    (r,) = again.refusals
    assert (r.path, r.rule, r.detail, r.exit_code) == ("model.safetensors", "sha256", "mismatch", 3)


def test_hint_survives_pickling():
    again = pickle.loads(pickle.dumps(Unavailable("hub down", hint="re-run")))
    assert (str(again), again.hint) == ("hub down", "re-run")
