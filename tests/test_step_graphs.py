"""A pack-step recorded once and replayed, as a CUDA graph replays it, trains to the very numbers of steps run op
by op. A CPU cannot record a CUDA graph, so `Recorder` stands in for one with the same contract: recording
notes every aten op with its arguments and runs nothing that outlives the recording (every write to a tensor
made before it is undone); a replay runs the noted ops again on the same tensors, with the same non-tensor
arguments, without any of the Python that issued them. What a step reads from a Python number (a learning
rate, a step count) is then frozen at its recorded value, as in a CUDA graph, and the numbers part."""
from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tests.test_fused import MIXED
from tests.test_fused_engine import Calls, as_on_gpu, same_numbers, small_dev
from trainables import fused
from trainables.fused import Pack, StepGraphs
from trainables.rows import make_row
from trainables.state import load_state, save_state


class Recorder(TorchDispatchMode):
    """Notes the aten ops a block dispatches; every tensor that existed before it and that an op writes is
    restored when it ends, so the block leaves no trace but the tensors it made (as a CUDA graph's capture)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.made: set[int] = set()  # storages the block allocated
        self.saved: dict[int, tuple] = {}  # storage -> (storage, its bytes before the block wrote it)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        if func._schema.is_mutable:
            for t in inputs:
                storage = t.untyped_storage()
                if storage.data_ptr() not in self.made and storage.data_ptr() not in self.saved:
                    self.saved[storage.data_ptr()] = (storage, storage.clone())
        out = func(*args, **kwargs)
        read = {t.untyped_storage().data_ptr() for t in inputs}
        for t in tree_flatten(out)[0]:  # a view, or an op's out= argument, is not new memory
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in read:
                self.made.add(t.untyped_storage().data_ptr())
        self.ops.append((func, args, kwargs, out))
        return out

    def undo(self) -> None:
        for storage, before in self.saved.values():
            storage.copy_(before)


class RecordedOps:
    """A stand-in for torch.cuda.CUDAGraph: replays what a Recorder noted."""

    def __init__(self):
        self.ops: list[tuple] = []
        self.replays = 0

    def pool(self):
        return None

    def replay(self) -> None:
        self.replays += 1
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                if func.is_view:  # its result shares the memory its input's replay writes
                    continue
                again = func(*args, **kwargs)
                for old, new in zip(tree_flatten(out)[0], tree_flatten(again)[0]):
                    if isinstance(old, torch.Tensor) and old.untyped_storage().data_ptr() != new.untyped_storage().data_ptr():
                        old.copy_(new)


@contextlib.contextmanager
def record(graph: RecordedOps, pool):
    recorder = Recorder()
    try:
        with recorder:
            yield
    finally:
        recorder.undo()
    graph.ops = recorder.ops


class Here:
    """A stand-in for SideStream: steps run op by op where they are, recordings by `capture`."""

    def __init__(self, capture=record):
        self.capture = capture

    @staticmethod
    def run(work):
        return work()


@pytest.fixture(autouse=True)
def rows_written_as_on_gpu(monkeypatch):
    """write_rows's GPU branch (index_copy_): on a CPU it writes through numpy, which no op records."""
    monkeypatch.setattr(fused, "write_rows", lambda table, rows, values: table.index_copy_(0, rows, values))


# dropout on; clipped, unclipped and never-clipped trials; two AdamW settings; 16 steps an epoch
CFGS = [dataclasses.replace(MIXED[i], train_size=64, batch_size=4) for i in (0, 1, 5, 6)]


def epochs(pack: Pack, n: int, steps: int | None = None) -> list[torch.Tensor]:
    """The losses of `n` epochs, or of each epoch's first `steps`."""
    losses = []
    for _ in range(n):
        batches, labels = pack.plan(pack.orders())
        losses += [pack.step(b, y) for b, y in list(zip(batches, labels))[:steps]]
    return losses


def state(pack: Pack) -> list[torch.Tensor]:
    parts = pack.parts(device=None)  # through parts: the optimizer keeps the word rows' moments between steps
    return [*parts.banks, *parts.exp_avg, *parts.exp_avg_sq, pack.clipped, pack.active]


def test_replayed_steps_train_to_the_numbers_of_steps_run_op_by_op(pretrained, synthetic):
    eager = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    graphed = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    graphs = graphed.graphs = StepGraphs(graphed, graph=RecordedOps, side=Here())
    expected, got = epochs(eager, 2), epochs(graphed, 2)
    replays = sum(r.graph.replays for r in graphs.recorded.values())
    assert len(graphs.recorded) >= 2 and replays >= len(got) // 3, (len(graphs.recorded), replays, len(got))
    for step, (a, b) in enumerate(zip(expected, got)):
        assert torch.equal(a, b), f"step {step}: losses {a.tolist()} op by op, {b.tolist()} replayed"
    for a, b in zip(state(eager), state(graphed)):
        assert torch.equal(a, b)
    assert graphed.optimizer.step_count == eager.optimizer.step_count == len(got)
    # the weights' bf16-or-not cast is made anew after replays: an evaluation reads the trained weights
    graphed.free_gradients(), eager.free_gradients()
    assert graphed.evaluate(synthetic.validation) == eager.evaluate(synthetic.validation)


def test_a_step_that_reads_a_python_number_would_replay_it_frozen(pretrained, synthetic):
    """The stand-in can tell: with the learning rate passed as a number, a replay keeps the recorded step's rate
    while the schedule decays it, and the weights part from those of steps run op by op."""
    eager = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    graphed = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    graphed.graphs = StepGraphs(graphed, graph=RecordedOps, side=Here())
    graphed.optimizer.lr_tables = None  # as before the learning rates were read from the device
    epochs(eager, 1), epochs(graphed, 1)
    assert not torch.equal(eager.banks[1], graphed.banks[1])


def test_gradients_made_anew_are_recorded_again(pretrained, synthetic):
    eager = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    graphed = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    graphs = graphed.graphs = StepGraphs(graphed, graph=RecordedOps, side=Here())
    epochs(eager, 1), epochs(graphed, 1)
    first = dict(graphs.recorded)
    for pack in (eager, graphed):  # the recordings write into the gradient banks they were made with
        pack.free_gradients()
    epochs(eager, 1), epochs(graphed, 1)
    assert graphs.recorded and not set(map(id, graphs.recorded.values())) & set(map(id, first.values()))
    assert all(torch.equal(a, b) for a, b in zip(state(eager), state(graphed)))


def graphs_made(made: list, graph=RecordedOps):
    """A stand-in for fused.step_graphs: every pack as on a GPU, with StepGraphs over the stand-in capture,
    each appended to `made`."""
    def stand_in(pack: Pack) -> StepGraphs:
        made.append(StepGraphs(as_on_gpu(pack), graph=graph, side=Here()))
        return made[-1]
    return stand_in


class EmptyRecording(RecordedOps):
    """A recording that replays nothing, as a CUDA graph whose capture caught no kernel."""

    def replay(self) -> None:
        self.replays += 1


def test_replays_that_run_nothing_stop_the_pack_at_its_first_epoch_end(pretrained, synthetic, monkeypatch):
    monkeypatch.setattr(fused, "step_graphs", graphs_made([], graph=EmptyRecording))
    reports = []
    with pytest.raises(RuntimeError, match=r"fused pack of 4: after 16 steps the optimizer's count on the device "
                                           r"is \d+: steps replayed as CUDA graphs did not run. Set "
                                           "REINIT_SWEEP_CUDA_GRAPHS=0 to run steps op by op"):
        fused.finetune_pack(CFGS, synthetic, pretrained, report=reports.append)
    assert reports == []  # no epoch of numbers that never trained was reported


def op_by_op(pack: Pack) -> None:
    """Another: every pack as on a GPU without graphs, its learning rates read as with them."""
    as_on_gpu(pack).optimizer.read_lr_from_device()


def test_a_pack_keeps_its_recordings_through_evaluations_between_epochs(pretrained, synthetic, monkeypatch):
    """finetune_pack with a dev evaluation after every epoch: the gradient banks stay, so each shape is recorded
    once for the run, not once an epoch, and the trials end with the numbers of steps run op by op."""
    made: list[StepGraphs] = []
    # 8 steps an epoch: shape A recorded in the first epoch and replayed through both evaluations, B recorded in
    # the third
    cfgs = [dataclasses.replace(c, epochs=3, eval_every=1, train_size=32) for c in CFGS]
    synthetic = small_dev(synthetic)
    monkeypatch.setattr(fused, "step_graphs", op_by_op)
    expected = fused.finetune_pack(cfgs, synthetic, pretrained)
    monkeypatch.setattr(fused, "step_graphs", graphs_made(made))
    got = fused.finetune_pack(cfgs, synthetic, pretrained)
    (graphs,) = made  # the last evaluation gave the recordings back: each shape seen is counted in `seen`
    recorded_shapes = sum(seen > graphs.warm_up for seen in graphs.seen.values())
    assert graphs.replays >= 2 * 8 and graphs.recordings == recorded_shapes >= 2, (graphs.seen, graphs.figures())
    for a, b in zip(expected, got):
        assert len(b["dev_metrics_by_epoch"]) == 3
        for key in ("dev_metrics_by_epoch", "train_loss", "weight_distance", "clipped_steps", "lr_last"):
            assert a[key] == b[key], key
        # and each trial's row says how it trained
        rows = [make_row({"trial_id": "t"}, result, result["status"]) for result in (a, b)]
        assert [row["cuda_graphs"] for row in rows] == [False, True]
        assert [row["triton_kernels"] for row in rows] == [False, False]  # torch's ops on a CPU


def test_with_graphs_a_pack_resumed_or_split_ends_with_the_numbers_of_one_run_op_by_op(
        pretrained, synthetic, tmp_path, monkeypatch):
    """What a replayed step reads from the device (the step count behind dropout's keys, the learning rate) comes
    back with a checkpoint, and with a split's halves: a pack resumed ends bitwise as the pack run through, and
    a pack split as the same split op by op. (A split itself may move a GPU pack's numbers by a rounding: its
    halves' batches are bucketed to their own widths.)"""
    cfgs = [dataclasses.replace(c, epochs=3, eval_every=1, train_size=32) for c in CFGS[:3]]  # 8 steps an epoch
    synthetic = small_dev(synthetic)
    saved, made = [], []

    def save(state):
        saved.append(tmp_path / f"state{len(saved)}")
        save_state(saved[-1], state)

    def numbers(results: list[dict]) -> list[list]:
        return [[r[key] for key in ("status", "dev_metrics_by_epoch", "train_loss", "weight_distance",
                                    "clipped_steps", "lr_last")] for r in results]

    monkeypatch.setattr(fused, "step_graphs", graphs_made(made))
    clean = fused.finetune_pack(cfgs, synthetic, pretrained, save=save, pack_id="p")
    resumed = fused.finetune_pack(cfgs, synthetic, pretrained, resume=load_state(saved[0]), pack_id="p")
    assert numbers(resumed) == numbers(clean) and {r["resumed_from_epoch"] for r in resumed} == {1}
    monkeypatch.setenv(fused.OOM_ABOVE, "2:13")  # epoch 2's sixth step, a replayed one: the pack of 3 splits
    split = fused.finetune_pack(cfgs, synthetic, pretrained)
    monkeypatch.setattr(fused, "step_graphs", op_by_op)
    assert numbers(split) == numbers(fused.finetune_pack(cfgs, synthetic, pretrained))
    assert [len(g.pack) for g in made] == [3, 3, 3, 1, 2] and all(g.replays for g in made), \
        [(len(g.pack), g.figures()) for g in made]
    # the halves went on from the step the pack stopped at (both ways of counting), to the numbers it would have
    # had whole, but for the rounding of their own widths
    assert [(g.pack.optimizer.step_count, int(g.pack.optimizer.steps)) for g in made[2:]] == \
        [(13, 13), (24, 24), (24, 24)]
    same_numbers(split, clean)


def test_a_recording_that_runs_out_of_memory_leaves_the_pack_to_run_op_by_op(pretrained, synthetic, capsys):
    """Its shape's warm-up step fit; a recording's pool did not (it cannot take the memory the allocator keeps
    cached for steps run op by op). The step is taken op by op, and so is every later one."""
    @contextlib.contextmanager
    def out_of_memory(graph, pool):
        with record(graph, pool):
            yield
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    eager = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    eager.optimizer.read_lr_from_device()
    graphed = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    graphs = graphed.graphs = StepGraphs(graphed, graph=RecordedOps, side=Here(out_of_memory))
    expected, got = epochs(eager, 2), epochs(graphed, 2)
    assert graphed.graphs is None and graphs.recordings == 1 and graphs.replays == 0
    assert graphs.recorded == {} and graphs.pool is None and not graphed.dropout.every_shape
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert all(torch.equal(a, b) for a, b in zip(state(eager), state(graphed)))
    assert "CUDA graphs off, its steps run op by op: recording a step ran out of memory (CUDA out of memory" \
        in capsys.readouterr().out


def test_a_recording_that_fails_or_keeps_what_it_made_is_refused(pretrained, synthetic):
    @contextlib.contextmanager
    def failing(graph, pool):
        with record(graph, pool):
            yield
            raise RuntimeError("operation not permitted when stream is capturing")

    pack = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    pack.graphs = StepGraphs(pack, graph=RecordedOps, side=Here(failing))
    with pytest.raises(RuntimeError, match="as a CUDA graph failed: RuntimeError: operation not permitted when "
                                           "stream is capturing. Set REINIT_SWEEP_CUDA_GRAPHS=0"):
        epochs(pack, 1)
    # recorded at its first sight, a shape's dropout coordinates would be made by the recording and kept
    pack = as_on_gpu(Pack(CFGS, synthetic, pretrained))
    pack.graphs = StepGraphs(pack, graph=RecordedOps, side=Here(), warm_up=0)
    with pytest.raises(RuntimeError, match="made dropout coordinates for"):
        epochs(pack, 1)


def test_learning_rates_read_from_the_device_give_the_numbers_of_python_floats_on_a_cpu(pretrained, synthetic):
    cfgs = [dataclasses.replace(c, lr_schedule="linear") for c in CFGS]
    plain, tabled = Pack(cfgs, synthetic, pretrained), Pack(cfgs, synthetic, pretrained)
    tabled.optimizer.read_lr_from_device()
    assert all(torch.equal(a, b) for a, b in zip(epochs(plain, 2), epochs(tabled, 2)))
    assert torch.equal(plain.banks[1], tabled.banks[1]) and torch.equal(plain.banks[0], tabled.banks[0])


# Ops that, on a GPU, make the host wait for the device (a value read back, an output sized by the data) or copy
# Python data to it: each would stall every step, and none may run during a CUDA graph's capture.
SYNCING = ("_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "equal", "_unique2", "unique_dim",
           "unique_consecutive", "repeat_interleave", "lift_fresh", "bincount", "histc", "multinomial")


def syncing(calls: Calls) -> list[str]:
    """The ops among `calls` that would make the host wait for the device or copy Python data to it."""
    found = []
    for op, args in calls.calls:
        name = op.__name__
        masked = name.startswith("index") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in tree_flatten(args)[0][1:])
        if name in SYNCING or masked:
            found.append(name)
    return found


def test_a_step_as_on_a_gpu_never_waits_for_the_device(pretrained, synthetic):
    pack = as_on_gpu(Pack([dataclasses.replace(c, precision="bf16") for c in CFGS], synthetic, pretrained))
    pack.optimizer.read_lr_from_device()
    batches, labels = pack.plan(pack.orders())
    pack.step(batches[0], labels[0])
    with Calls() as calls:
        pack.step(batches[1], labels[1])
    assert syncing(calls) == []
    # the probe can tell: a step that reads a value back is caught
    with Calls() as calls:
        bool(pack.active.any())
    assert syncing(calls) == ["_local_scalar_dense"]


class FakeStream:
    def __init__(self, name: str, log: list):
        self.name, self.log = name, log

    def wait_stream(self, other) -> None:
        self.log.append(f"{self.name} waits for {other.name}")


def test_the_side_stream_runs_between_the_current_streams_work_even_when_a_step_fails(monkeypatch):
    """SideStream's ordering, with CUDA's stream calls stood in for: its step after the current stream's queued
    work and before its next, a failed step (an out-of-memory error splits the pack, whose state is then
    copied on the current stream) included; a failed capture leaves the current stream current."""
    log: list[str] = []
    current, side = FakeStream("current", log), FakeStream("side", log)

    @contextlib.contextmanager
    def on(stream):
        log.append(f"on {stream.name}")
        yield
        log.append(f"off {stream.name}")

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None, capture_error_mode=None):
        log.append(f"capture on {stream.name} ({capture_error_mode})")
        yield
        raise RuntimeError("the capture was invalidated")

    monkeypatch.setattr(torch.cuda, "Stream", lambda: side)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: current)
    monkeypatch.setattr(torch.cuda, "stream", on)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    monkeypatch.setattr(torch.cuda, "set_stream", lambda stream: log.append(f"{stream.name} current"))

    class Losses:
        def record_stream(self, stream):
            log.append(f"used on {stream.name}")

    def step():
        log.append("step")
        return Losses()

    def failing():
        log.append("step")
        raise torch.OutOfMemoryError("CUDA out of memory")

    streams = fused.SideStream()
    streams.run(step)
    assert log == ["side waits for current", "on side", "step", "off side", "current waits for side", "used on current"]
    log.clear()
    with pytest.raises(torch.OutOfMemoryError):
        streams.run(failing)
    assert log == ["side waits for current", "on side", "step", "current waits for side"]
    log.clear()
    with pytest.raises(RuntimeError, match="invalidated"):
        with streams.capture(object(), None):
            log.append("recorded")
    assert log == ["capture on side (thread_local)", "recorded", "current current"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_on_a_gpu_replayed_steps_train_as_steps_run_op_by_op(pretrained, synthetic, precision, monkeypatch):
    """The real thing: torch's CUDA graphs on a GPU, against the same steps run op by op with the learning
    rates read from the device too. Not bitwise: CUDA's index_add_ adds a word's repeats in any order."""
    cfgs = [dataclasses.replace(c, precision=precision) for c in CFGS]
    graphed = Pack(cfgs, synthetic, pretrained, device="cuda")  # graphs: a GPU pack's default
    monkeypatch.setenv(fused.CUDA_GRAPHS, "0")
    eager = Pack(cfgs, synthetic, pretrained, device="cuda")
    graphs = graphed.graphs
    assert graphs is not None and eager.graphs is None
    eager.optimizer.read_lr_from_device()
    expected, got = torch.stack(epochs(eager, 2)), torch.stack(epochs(graphed, 2))
    assert graphs.recorded and graphs.replays >= len(got) // 3
    tolerance = 1e-4 if precision == "fp32" else 2e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(graphed.banks[1], eager.banks[1], rtol=tolerance, atol=tolerance)


def test_gpu_packs_replay_their_steps_unless_told_not_to(monkeypatch):
    """On by default on GPUs since an H200 measured them (docs/benchmarks.md); "0" turns them off, any other value
    is refused with what is allowed; a CPU pack never records."""
    from types import SimpleNamespace

    monkeypatch.setattr(fused, "StepGraphs", lambda pack: ("graphs of", pack))
    on = lambda kind: SimpleNamespace(compute=SimpleNamespace(device=torch.device(kind)))  # noqa: E731
    gpu, cpu = on("cuda"), on("cpu")
    monkeypatch.delenv(fused.CUDA_GRAPHS, raising=False)
    assert fused.step_graphs(gpu) == ("graphs of", gpu) and fused.step_graphs(cpu) is None
    monkeypatch.setenv(fused.CUDA_GRAPHS, "0")
    assert fused.step_graphs(gpu) is None
    for value in ("1", ""):  # empty: as if unset
        monkeypatch.setenv(fused.CUDA_GRAPHS, value)
        assert fused.step_graphs(gpu) == ("graphs of", gpu)
    monkeypatch.setenv(fused.CUDA_GRAPHS, "yes")
    with pytest.raises(ValueError, match=r"REINIT_SWEEP_CUDA_GRAPHS='yes': allowed are 1 .* and 0"):
        fused.step_graphs(gpu)


def test_with_torchs_update_every_bf16_recording_holds_the_weights_cast(pretrained, synthetic, monkeypatch):
    """With the Triton kernels off, nothing but the forward's refresh casts bank 1 to bf16, so every recorded
    step must hold that cast, even one recorded at the step count of a cast made just before (an evaluation
    between epochs): left out, its replays would read the weights of one update before."""
    monkeypatch.setenv("REINIT_SWEEP_TRITON", "0")
    pack = as_on_gpu(Pack([dataclasses.replace(c, precision="bf16") for c in CFGS[:2]], synthetic, pretrained))
    pack.graphs = StepGraphs(pack, graph=RecordedOps, side=Here())
    batches, labels = pack.plan(pack.orders())
    pack.step(batches[0], labels[0])  # a warm-up step, op by op
    with torch.no_grad():
        pack.encoder.refresh()  # as an evaluation at this step count would
    recorded = pack.graphs.record((0,), batches[0], labels[0])
    low = pack.encoder.low.untyped_storage().data_ptr()
    casts = [args for func, args, _, _ in recorded.graph.ops
             if func is torch.ops.aten.copy_.default and args[0].untyped_storage().data_ptr() == low]
    assert len(casts) == 1
