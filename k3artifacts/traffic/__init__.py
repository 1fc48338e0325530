"""Traffic analysis: the PromQL over vLLM's own metrics that judges a canary step, asked of
Prometheus by the cluster (the rendered AnalysisTemplate) and by ``k3a traffic analyze`` (the
evidence the ``traffic`` gate reads)."""
