"""Per-rank oracles on one CPU: transformers' own distribution of a model (tensor, expert and pipeline parallelism,
FSDP2) applied on torch's fake process group, read rank by rank; and what autograd saves in a tensor-parallel forward."""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from oracle import by_module, hf_config, normal, saved_by_creator

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")


@contextlib.contextmanager
def fake_world(world: int, rank: int) -> Iterator[None]:
    """torch.distributed on the fake backend: every collective a no-op, every rank's shapes real."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def world_size(degrees: dict[str, int]) -> int:
    return degrees.get("pp_size", 1) * degrees.get("fsdp_size", 1) * degrees.get("tp_size", 1)


def distribute(config: dict[str, Any], degrees: dict[str, int], device: str = "meta", dtype: torch.dtype | None = None):
    """The model of `config` distributed as transformers does it (PreTrainedModel.maybe_distribute_model: pipeline,
    tensor and expert parallelism, then FSDP2) on the current rank; DistributedConfig from `degrees`."""
    import transformers
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import initialize_distributed_mesh

    dc = DistributedConfig(**degrees)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(hf_config(config), attn_implementation="sdpa")
    if dtype is not None:
        model = model.to(dtype)
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    if tied:  # from_pretrained distributes the model untied and ties it after loading; distributing it tied fails
        head.weight = torch.nn.Parameter(torch.empty_like(head.weight))
    _, mesh = initialize_distributed_mesh(dc)
    model = type(model).maybe_distribute_model(model, dc, mesh)
    if tied and all(hasattr(m, "weight") for m in (model.get_input_embeddings(), model.get_output_embeddings())):
        model.tie_weights()  # the stages that hold both (pipeline parallelism keeps the table on the last stage)
    return model


def local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t._local_tensor if isinstance(t, DTensor) else t


def rank_parameters(config: dict[str, Any], degrees: dict[str, int], rank: int) -> dict[str, tuple[int, int]]:
    """Per parameter name (layer indices left out, summed over the layers the rank holds): elements of the rank's own
    shard and of the storage it allocates for it (FSDP2 pads a shard to ceil(rows/D) rows)."""
    with fake_world(world_size(degrees), rank):
        model = distribute(json.loads(json.dumps(config)), degrees)
        out: dict[str, tuple[int, int]] = {}
        for name, p in model.named_parameters():
            t = local(p)
            own, stored = out.get(normal(name), (0, 0))
            out[normal(name)] = (own + t.numel(), stored + t.untyped_storage().nbytes() // t.element_size())
        return out


def saved_bytes(config: dict[str, Any], degrees: dict[str, int], rank: int, batch: int, seq: int, modules: set[str]) -> dict[str, int]:
    """What autograd keeps for backward in one bf16 training forward with the loss of the model distributed on `rank`
    (DTensor computes on the local shards): bytes of every saved storage once, parameters excluded, by the module
    whose forward allocated it, folded up to the nearest of symparam's `modules`."""
    with fake_world(world_size(degrees), rank):
        model = distribute(config, degrees, device="cpu", dtype=torch.bfloat16).train()
        ids = torch.randint(0, config["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(batch * 1000 + seq))
        saved = saved_by_creator(model, ids, local)
    return by_module(saved, modules)


def step_state(config: dict[str, Any], degrees: dict[str, int], rank: int) -> dict[str, int]:
    """Bytes a rank holds after an fp32 training step of the distributed model with torch's AdamW (foreach): its
    parameters', gradients' and optimizer states' storages, each storage once."""
    with fake_world(world_size(degrees), rank):
        model = distribute(config, degrees, device="cpu").train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        ids = torch.randint(0, config["vocab_size"], (2, 5), generator=torch.Generator().manual_seed(0))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

        def total(tensors) -> int:
            seen = {local(t).untyped_storage().data_ptr(): local(t).untyped_storage().nbytes() for t in tensors}
            return sum(seen.values())

        params = list(model.parameters())
        return {"weights": total(params), "gradients": total(p.grad for p in params),
                "optimizer_states": total(v for p in params for v in optimizer.state[p].values())}
