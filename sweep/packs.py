"""Fused packs in a sweep (--pack): which trials train together as one Tune trial, and with what resources.

A pack is one Tune trial whose config holds its members' trial configs; it trains them as one computation
(trainables.fused.finetune_pack) and its rows land one per member, with the member's own trial_id, when the
pack ends. Trials that cannot be fused (sequential finetuning, a held-out search objective, a model without
BERT's layout) stay single trials, run by `finetune` as with --pack 1.
"""
from __future__ import annotations

import hashlib
import json
import time

from sweep.checks import Refused

# --pack auto on CPUs: every trial through the fused encoder, one trial a pack. Measured on this project's
# 2-core CPU (docs/benchmarks.md, "Fused packs", 2026-11-23): the fused encoder trains a MiniLM step in 0.14 s on
# one thread where the Hugging Face model takes 0.33 s, while more trials in one pack gain nothing on a CPU (one
# trial's matmuls already keep its cores busy): two packs of one side by side, a thread each, did a trial step
# in 0.08 s of the machine, a pack of 2 on both threads in 0.10 s. Packs of one also land each row as it ends.
AUTO_PACK_CPU = 1
# --pack auto on GPUs: a Tune trial holds GPU_PACKS_PER_TRIAL groups of as many trials as fit in the free
# memory of the card with the least (trainables.fused.group_size, at its measured bytes a parameter, at most
# MAX_GROUP): one group trains while the next is set up, so the card waits on no setup but the
# first. The trainable sizes its groups again from its own card's free memory.
GPU_PACKS_PER_TRIAL = 3
# How long --pack auto waits for every GPU node to say how much card memory is free: long enough for an
# autoscaler to bring up a GPU node (several minutes on EC2), short enough that a sweep with none coming, or every
# card held by other work, is refused with what to do instead of waiting without a word.
GPU_PROBE_TIMEOUT_S = 900.0
PROBE_NOTICE_S = 60.0


def parse_pack(value: str) -> int | str:
    """--pack: a whole number >= 1, or 'auto'."""
    import argparse

    if value == "auto":
        return value
    if not isinstance(value, str) or not value.isdigit() or int(value) < 1:  # a file's list or mapping, too
        raise argparse.ArgumentTypeError(f"'{value}' is neither a whole number of trials >= 1 nor 'auto'")
    return int(value)


def memory_sized_pack(gpu_memory_bytes: int, parameters: int) -> int:
    """The most trials of `parameters` each that fit in `gpu_memory_bytes` free (1..MAX_GROUP), as the trainable
    sizes its groups on its own card."""
    from trainables.fused import MAX_GROUP, group_size

    return group_size(MAX_GROUP, gpu_memory_bytes, parameters)


def resolve_pack(pack: int | str, gpus_per_trial: float, parameters: int) -> tuple[int, bool]:
    """(trials a pack, whether a trial alone is fused too). --pack N: N as given, and a trial left alone
    (N = 1: every trial) trains unfused, as before packs; auto: fused packs of AUTO_PACK_CPU on CPUs,
    memory-sized on GPUs. Packs checkpoint as single trials do, so checkpoints change nothing here."""
    if pack != "auto":
        return int(pack), False
    if gpus_per_trial == 0:
        return AUTO_PACK_CPU, True
    return GPU_PACKS_PER_TRIAL * memory_sized_pack(gpu_memory(gpus_per_trial), parameters), True


def gpu_memory(gpus_per_trial: float, timeout_s: float = GPU_PROBE_TIMEOUT_S, say=print) -> int:
    """The free memory of the GPU with the least of it, asked of a Ray task on every node that has GPUs (the
    driver may have none; nodes may hold different cards, or cards partly taken by others): a pack sized from
    it fits on any of them. With no GPU node up yet (an autoscaler brings them), the first one to come says.
    A question still unanswered after `timeout_s` (no GPU node comes, or every card is held by other work) is
    refused, saying how to size packs without it; while it waits, `say` says so once a minute."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # No CPU: each GPU node is asked, and one that declares none (kept free of trials) would never run the question.
    @ray.remote(num_cpus=0, num_gpus=min(gpus_per_trial, 1.0))
    def free_memory() -> int:
        import torch

        return int(torch.cuda.mem_get_info()[0])

    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) > 0]
    asked = ([free_memory.remote()] if not nodes else
             [free_memory.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
              for node in nodes])
    answers, pending = [], asked
    began = time.monotonic()
    notice = began + PROBE_NOTICE_S
    while pending:
        now = time.monotonic()
        if now >= began + timeout_s:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise Refused([f"--pack auto: {len(pending)} of {len(asked)} GPU node(s) did not say how much of their "
                           f"card's memory is free within {timeout_s:.0f} s (no GPU node up yet, or every card held "
                           f"by other work with {gpus_per_trial} of a GPU not free; `ray status` shows which): give "
                           "--pack N (trials a pack) to size packs without asking, or start once GPU nodes are up"])
        done, pending = ray.wait(pending, num_returns=1, timeout=min(began + timeout_s, notice) - now)
        answers += ray.get(done)  # a node's error (torch's, say) is raised as it comes
        if not done and time.monotonic() >= notice:
            say(f"--pack auto: waiting for {len(pending)} GPU node(s) to say how much card memory is free "
                f"({notice - began:.0f} s of {timeout_s:.0f}; an autoscaler may still be bringing them up)", flush=True)
            notice += PROBE_NOTICE_S
    return min(answers)


def fusable(trial: dict, pretrained) -> bool:
    """Whether a trial config (TrialSpec.to_config) can join a pack."""
    from trainables.fused import unfused_reason
    from trainables.tune_trainable import finetune_config

    return unfused_reason(finetune_config(trial, gpu_fraction=0.0, threads=1), pretrained) is None


def pack_key(trial: dict) -> tuple:
    """Trials with equal keys train in lock step: same model, data and shape of training."""
    from trainables.fused import pack_key as shape_key
    from trainables.tune_trainable import finetune_config

    return trial["model_key"], trial["data_key"], shape_key(finetune_config(trial, gpu_fraction=0.0, threads=1))


def pack_config(members: list[dict]) -> dict:
    """The Tune config of a pack: its members, and an id of its own (it names the Tune trial and its TensorBoard
    folder, and is each member row's pack_id), fixed by its members so a resumed sweep names it the same; a
    pack of one is named by its trial."""
    digest = hashlib.sha256(" ".join(m["trial_id"] for m in members).encode()).hexdigest()[:10]
    first = members[0]["row"]
    if len(members) == 1:  # its trial's own config beside `pack`: TensorBoard's HPARAMS show the trial's settings
        return {**members[0], "pack": members}
    return {"trial_id": f"pack-{first['experiment']}-{first['task']}-n{first['train_size']}-{digest}",
            "model_key": members[0]["model_key"], "data_key": members[0]["data_key"], "pack": members}


def group_into_packs(trials: list[dict], size: int, pretrained: dict, fuse_alone: bool = False) -> list[dict]:
    """Tune configs for `trials`: packs of up to `size` trials of equal pack_key, in the order the trials
    come; a trial that cannot be fused stays as it is, and so does one alone in its pack unless `fuse_alone`."""
    if size == 1 and not fuse_alone:
        return list(trials)
    units, groups = [], {}
    for trial in trials:
        if not fusable(trial, pretrained[trial["model_key"]]):
            units.append(trial)
        else:
            groups.setdefault(pack_key(trial), []).append(trial)
    for members in groups.values():
        for start in range(0, len(members), size):
            chunk = members[start:start + size]
            units.append(pack_config(chunk) if len(chunk) > 1 or fuse_alone else chunk[0])
    return units


def resumed_packs(todo: list[dict], known: dict[str, dict], earlier: list[list[str]], size: int | None
                  ) -> tuple[list[dict], list[dict], set[str]]:
    """For a `--resume`: the packs that earlier runs left checkpoints of (`earlier`: their members' trial ids,
    newest first; trainables.tune_trainable.earlier_pack_members), formed again with the same members, so the same
    id, by which each finds its checkpoint and goes on from it. Grouping only the trials still to run would make
    other packs as soon as one member's row had landed (it diverged, or its group finished before the others),
    and they would start over. A pack is formed again when one of its members is still to run (`todo`), all of
    them are to run or have rows that stand (`known`, by trial_id; a trial of neither would train along and lose
    its row), it holds at most `size` (None: any number), and no newer pack claimed one of them. Members whose
    rows stand train along as they did; their rows are not written again. Returns (those packs, the trials left
    to group, the ids of the members whose rows stand)."""
    waiting = {t["trial_id"] for t in todo}
    claimed: set[str] = set()
    units, standing = [], set()
    for ids in earlier:
        if not waiting & set(ids) or len(ids) > (size or len(ids)) or claimed & set(ids) \
                or not all(i in known for i in ids):
            continue
        units.append(pack_config([known[i] for i in ids]))
        claimed |= set(ids)
        standing |= set(ids) - waiting
    return units, [t for t in todo if t["trial_id"] not in claimed], standing


def pack_results(result: dict) -> dict[str, dict]:
    """A pack's report: each member's latest figures by trial_id (packs used to report a list of them; a Tune
    experiment restored from then still holds one), and `{"trial_id": ..., "waiting": True}` for each member
    that waits for an earlier group of the pack to finish (`pack_waiting`, a JSON list of trial_ids: Tune's
    loggers skip a string; reports made before it name none)."""
    found = result.get("pack_results") or {}
    by_id = {r["trial_id"]: r for r in found if r} if isinstance(found, list) else dict(found)
    waiting = json.loads(result.get("pack_waiting") or "[]")
    return {**{t: {"trial_id": t, "waiting": True} for t in waiting if t not in by_id}, **by_id}


def members(trial: dict) -> list[dict]:
    """The trial configs a Tune trial's config stands for: a pack's members, or itself."""
    return trial.get("pack", [trial])


def pack_resources(cpus_per_trial: float, gpus_per_trial: float, nodes: list[dict], parameters: int = 0,
                   bootstrap: str | None = None):
    """Tune's resources for a config, from the nodes Ray reports (`ray.nodes()`) and those the cluster's
    autoscaler may add. A pack gets its members' CPUs and GPU shares, but one bundle lands on one node: at most
    the CPUs of the largest node that holds a trial, and one card (or the whole GPUs one trial asks for).
    A trial that no node can hold (CPUs, GPUs, and on CPUs the memory `parameters` take to train) is refused
    here, before any trial starts, rather than waiting forever."""
    from ray import tune

    from sweep.checks import BOOTSTRAP_CONFIG, Refused, holds, node_shapes, placement_problems
    from trainables.fused import PEAK_BYTES_PER_PARAMETER

    # On a GPU the weights live in the card's memory, which --pack auto sizes packs by (resolve_pack).
    memory = PEAK_BYTES_PER_PARAMETER * parameters if not gpus_per_trial else 0.0
    shapes = node_shapes(nodes, bootstrap or BOOTSTRAP_CONFIG)
    problems = placement_problems(cpus_per_trial, gpus_per_trial, shapes, memory)
    if problems:
        raise Refused(problems)
    largest = max((s for s in shapes if holds(s, cpus_per_trial, gpus_per_trial, memory)),
                  key=lambda s: (s["CPU"], s["GPU"]))

    def resources(config: dict):
        n = len(members(config["trial"]))
        gpus = min(gpus_per_trial * n, max(1.0, gpus_per_trial), largest["GPU"]) if gpus_per_trial else 0.0
        return tune.PlacementGroupFactory([{"CPU": min(cpus_per_trial * n, largest["CPU"]), "GPU": gpus}])

    return resources


def pack_memory_problems(units: list[dict], cpus_per_trial: float, nodes: list[dict], parameters: int,
                         bootstrap: str | None = None) -> list[str]:
    """Whether the largest pack of CPU trials fits in the memory of a node that can hold its bundle. On a CPU a
    pack trains all its members at once (trainables.fused sizes groups by a GPU's memory only), so it holds each
    member's weights, gradients and Adam moments on the one node Ray puts it on; pack_resources checked one
    trial's. A pack too large for any node is killed for its memory, and again on every retry."""
    from sweep.checks import BOOTSTRAP_CONFIG, describe_shape, holds, node_shapes
    from trainables.fused import PEAK_BYTES_PER_PARAMETER

    largest = max((len(members(u)) for u in units if "pack" in u), default=1)
    if largest <= 1 or not parameters:
        return []
    per_trial = PEAK_BYTES_PER_PARAMETER * parameters
    shapes = node_shapes(nodes, bootstrap or BOOTSTRAP_CONFIG)
    most_cpus = max((s["CPU"] for s in shapes if holds(s, cpus_per_trial, 0.0, per_trial)), default=None)
    if most_cpus is None:  # no node holds one trial: pack_resources said so
        return []

    def fits(size: int) -> bool:  # the bundle of pack_resources, and the memory of its members
        return any(holds(s, min(cpus_per_trial * size, most_cpus), 0.0, size * per_trial) for s in shapes)

    if fits(largest):
        return []
    able = [s for s in shapes if holds(s, min(cpus_per_trial * largest, most_cpus), 0.0)]
    most = max(s["memory"] for s in able)
    smaller = next(size for size in range(largest - 1, 0, -1) if fits(size))
    return [f"--pack: {largest} trials a pack on CPUs need {largest * per_trial / 2**30:.1f} GiB of memory on one node "
            f"({per_trial / 2**30:.2f} GiB each: weights, gradients, Adam moments and the reference copy), but a node "
            f"of this Ray cluster that holds its {min(cpus_per_trial * largest, most_cpus):g} CPUs gives tasks at most "
            f"{most / 2**30:.1f} GiB (nodes: {'; '.join(describe_shape(s) for s in shapes)}); give --pack {smaller} "
            "or less, or nodes with more memory"]
