"""The one statistical judge of "is the candidate slower than the baseline": per-request
samples of both, a one-sided Mann-Whitney U test (:mod:`.utest`) and the Hodges-Lehmann
shift, judged pass, fail or inconclusive (:mod:`.compare`). Pure: no store, no I/O."""
