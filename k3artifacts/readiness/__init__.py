"""Is an endpoint ready to take a tuple's traffic: real requests through the official ``openai``
client against an OpenAI-compatible endpoint (vLLM), judged check by check, with a concurrency
sweep, written as a report the evaluation gate can trust (``releases/evaluations.py``)."""
