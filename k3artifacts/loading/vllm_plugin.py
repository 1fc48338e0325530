"""``--load-format k3a``: vLLM's weights read once, hashed in the same pass, against the signed
manifest of the tuple the server was started for.

vLLM runs every ``vllm.general_plugins`` entry point (pyproject.toml) in each of its processes
before loading; :func:`register` adds the load format there. vLLM is imported only here, and
only when vLLM calls it: the library imports without vLLM.

The server is started with::

    vllm serve /models/<org>/<name>/<commit> --load-format k3a \\
        --model-loader-extra-config '{"tuple": "<tuple id>", "store": "<store url>"}'

and ``XDG_CONFIG_HOME`` where the store's pinned root is (as ``k3a verify --signature`` in the
pod reads it). Optional keys: ``channel`` (trust only that channel's keys), ``threads`` and
``files_in_flight`` (the reader's, :func:`~k3artifacts.loading.stream.stream_tensors`),
``refusals`` (a node cache's ``.k3a-cache/refused`` directory: a file refused is recorded there,
and the next ``k3a pull --verified-by-loader`` fetches it again).
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

LOAD_FORMAT = "k3a"

log = logging.getLogger(__name__)


class LoaderConfig(BaseModel):
    """``--model-loader-extra-config`` of the ``k3a`` load format."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tuple: str
    store: str
    channel: str | None = None
    threads: int = Field(default=8, ge=1)
    files_in_flight: int | None = Field(default=None, ge=1)
    refusals: str | None = None


def register() -> None:
    """The ``vllm.general_plugins`` entry point: registers the ``k3a`` load format."""
    import torch
    from vllm.distributed.parallel_state import get_world_group
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.ep_weight_filter import should_skip_weight

    from k3artifacts.errors import UnsafeCacheEntry, VerifyMismatch
    from k3artifacts.loading.plan import plan_load
    from k3artifacts.loading.share import agree, node_position, node_share
    from k3artifacts.loading.stream import FileRefused, stream_tensors
    from k3artifacts.nodecache import refusals
    from k3artifacts.stores.registry import open_store

    @register_model_loader(LOAD_FORMAT)
    class K3ALoader(BaseModelLoader):
        def __init__(self, load_config):
            super().__init__(load_config)
            self.config = LoaderConfig.model_validate(load_config.model_loader_extra_config)
            self.local_expert_ids: set[int] | None = None

        def download_model(self, model_config) -> None:
            """Nothing to fetch: the node holds the revision (``k3a pull``)."""

        def load_weights(self, model, model_config) -> None:
            cfg = self.config
            # Signatures, manifest and the small files, before any weight byte is read.
            plan = plan_load(open_store(cfg.store), cfg.tuple, Path(model_config.model),
                             channel=cfg.channel)
            group = get_world_group().cpu_group
            index, count = node_position(group)
            # Experts this rank keeps, exactly as vLLM's own loader decides them.
            DefaultModelLoader._init_ep_weight_filter(self, model_config)
            experts = self.local_expert_ids
            wanted = None if experts is None else \
                (lambda name: not should_skip_weight(name, experts))
            device = (torch.device("cuda", torch.cuda.current_device())
                      if torch.cuda.is_available() else torch.device("cpu"))
            share = node_share(plan.shards, index, count)
            # Alone on its node a rank hashes every byte it reads: no identity to compare.
            seen = {} if count > 1 else None
            refusal = None
            try:
                model.load_weights(stream_tensors(
                    share, device, threads=cfg.threads, files_in_flight=cfg.files_in_flight,
                    wanted=wanted, seen=seen))
            except (VerifyMismatch, UnsafeCacheEntry) as exc:
                refusal = exc
                if isinstance(exc, FileRefused) and cfg.refusals is not None:
                    try:
                        refusals.record(Path(cfg.refusals), plan.manifest_digest, exc.rel,
                                        exc.why)
                    except OSError as err:  # the refusal stands; only the repair is lost
                        log.warning("recording the refusal of %s in %s: %s", exc.rel,
                                    cfg.refusals, err)
            agree(refusal, group, share, seen or {})
