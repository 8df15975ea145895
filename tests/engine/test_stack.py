"""Stacked clients (engine.vectorize, raysim/engine/stack.py): a stack computes what one client at a time
computes, bit for bit for the MLPs (and within float32 rounding for a CNN), with each client's own batches, clients
of different sizes, per-client loss parts and non-finite stops; algorithms declare it; the config says when clients
will train one at a time anyway."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from conftest import EXAMPLE_PLUGINS, refused_config, strip_timing, tiny_overrides
from raysim.algorithms.base import Algorithm, ClientUpdate
from raysim.algorithms.fedavg import FedAvg
from raysim.checks import config_warnings
from raysim.config import load_config
from raysim.data import build_federated_data
from raysim.engine import vectorize_probe
from raysim.engine.stack import train_stack
from raysim.engine.exact_kernels import OneClientOrder, _SerialLinear
from raysim.engine.core import ClientJobs
from raysim.engine.jobs import TrainJob
from raysim.engine.runner import run_experiment
from raysim.engine.state import read_checkpoint
from raysim.models import build_model
from raysim.registry import get_algorithm, register_algorithm, register_model

if str(EXAMPLE_PLUGINS) not in sys.path:  # resmlp, a model plugin with dropout
    sys.path.insert(0, str(EXAMPLE_PLUGINS))

SUPPORTED = ["fedavg", "local", "fedprox", "partialavg", "partialkd", "unideal", "fedrep", "fedbabu", "fapd",
             "fedavgm", "fedadam", "ditto", "scaffold", "feddyn"]
# each algorithm's own parts in play: several local epochs (FedRep's two phases, UNIDEAL's moving p), its knobs;
# SCAFFOLD and FedDyn over three rounds, so that clients return with kept state beside new ones (FedDyn's α_k
# scaled per client, its gradient clip tight enough to bite)
EXTRA: dict[str, dict] = {
    "fedprox": {"algorithm__mu": 0.1},
    "scaffold": {"train__momentum": 0, "rounds": 3},
    "feddyn": {"algorithm__scale_alpha": "true", "algorithm__max_grad_norm": 0.5, "rounds": 3},
    "unideal": {"train__local_epochs": 3, "algorithm__kd_norm": "kept", "algorithm__metric": "l2"},
    "fedrep": {"algorithm__head_epochs": 2},
    "fedbabu": {"algorithm__finetune_epochs": 1},
    "fapd": {"algorithm__teacher__epochs": 3, "algorithm__k0": 2, "algorithm__delta_k": 3},
}


@pytest.fixture(autouse=True)
def one_thread():
    """One torch thread, as a worker with engine.cpus_per_worker=1 has: with more, one client's matrix products
    split their sums over threads while a stack's split over clients, another summation order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _cfg(tmp_path: Path, algorithm: str, **extra: object):
    over = {"algorithm__name": algorithm, "engine__backend": "inline", "clients__num": 8, "clients__fraction": 0.75,
            "data__partition": "dirichlet", "train__local_epochs": 2, "train__momentum": 0.9,
            **EXTRA.get(algorithm, {}), **extra}
    if algorithm == "fapd":
        over["algorithm__teacher__cache_dir"] = str(tmp_path / "cache")
    return load_config(None, tiny_overrides(tmp_path, **over))


def _setup(tmp_path: Path, algorithm: str, **extra: object):
    """(core, jobs of round 1 for every client, the round's shared payload) of a tiny config, in this process."""
    cfg = _cfg(tmp_path, algorithm, **extra)
    alg = get_algorithm(algorithm)(cfg)
    data = alg.prepare_data(build_federated_data(cfg))
    initial = build_model(cfg, cfg.model.for_client(0), data.input_shape(0), data.num_classes, 0, alg)
    shared = alg.server_payload(alg.init_server_state(initial.state_dict()), 1)
    jobs = [TrainJob(client_id=c, round=1, payload_ref=None) for c in range(cfg.clients.num)]
    return ClientJobs(cfg, data, algorithm=alg), jobs, shared


def _same_tree(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_tree(a[k], b[k]) for k in a)
    return a == b


# ---------------------------------------------------------------------------------------------- the stack itself
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_a_cohort_is_each_client_alone_bit_for_bit(tmp_path, optimizer):
    """Clients of different sizes (Dirichlet: different batch counts, short and merged last batches), momentum and
    weight decay, two epochs: every upload, kept state, loss and part equals the one-at-a-time job's."""
    lr = {"sgd": 0.1, "adam": 0.01}[optimizer]
    core, jobs, shared = _setup(tmp_path, "unideal", train__optimizer=optimizer, train__lr=lr,
                                train__weight_decay=0.01, train__batch_size=16)
    alone = [core.train(j, shared, None, None) for j in jobs]
    together = train_stack(core, jobs, shared, [None] * len(jobs), [None] * len(jobs))
    assert len({r.num_samples for r, _ in alone}) == len(jobs)  # clients of different sizes
    for (r1, keep1), (r2, keep2) in zip(alone, together):
        assert r1.client_id == r2.client_id and r1.num_samples == r2.num_samples
        assert _same_tree(r1.upload, r2.upload) and _same_tree(keep1, keep2)
        assert (r1.loss, r1.parts, r1.finite, r1.has_state) == (r2.loss, r2.parts, r2.finite, r2.has_state)
        assert set(r2.parts) == {"ce", "clkd"}


def test_jobs_come_back_in_the_order_given_whatever_it_is(tmp_path):
    core, jobs, shared = _setup(tmp_path, "fedavg")
    shuffled = [jobs[i] for i in (5, 0, 7, 2)]
    together = train_stack(core, shuffled, shared, [None] * 4, [None] * 4)
    assert [r.client_id for r, _ in together] == [5, 0, 7, 2]
    alone = core.train(jobs[7], shared, None, None)[0]
    assert _same_tree(together[2][0].upload, alone.upload)


@register_algorithm("scaled_fedavg")
class ScaledFedAvg(FedAvg):
    """A test algorithm whose loss reads the client's kept state under vmap: each client's loss is scaled by its own
    ``scale`` (NaN for client 1, whose job must then stop as it does alone)."""

    vectorizable = True

    def init_client_state(self, model, ctx):
        return {"scale": torch.tensor(float("nan") if ctx.client_id == 1 else 1.0 + ctx.client_id / 10)}

    def client_loss(self, model, x, y, ctx):
        ce = F.cross_entropy(model(x), y)
        return ce * ctx.state["scale"], {"ce": ce}

    def client_keep(self, model, ctx):
        return {"scale": ctx.state["scale"]}


def test_per_client_state_and_a_non_finite_client(tmp_path):
    core, jobs, shared = _setup(tmp_path, "scaled_fedavg")
    alone = [core.train(j, shared, None, None) for j in jobs[:4]]
    together = train_stack(core, jobs[:4], shared, [None] * 4, [None] * 4)
    assert [r.finite for r, _ in together] == [True, False, True, True] == [r.finite for r, _ in alone]
    for c in (0, 2, 3):  # the others are not touched by client 1's NaN
        assert _same_tree(alone[c][0].upload, together[c][0].upload)
        assert alone[c][0].loss == together[c][0].loss and alone[c][0].parts == together[c][0].parts
    # client 1 stopped after its first epoch, as alone: the same (NaN) upload
    assert all(torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
               for a, b in zip(alone[1][0].upload.values(), together[1][0].upload.values()))


@register_algorithm("mixed_state")
class MixedState(FedAvg):
    """A test algorithm that declares vectorisable hooks wrongly: client 0 starts with no state, the others with
    one, and the loss reads it."""

    vectorizable = True

    def init_client_state(self, model, ctx):
        return {} if ctx.client_id == 0 else {"scale": torch.tensor(2.0)}

    def client_loss(self, model, x, y, ctx):
        return F.cross_entropy(model(x), y) * ctx.state.get("scale", 1.0), {}


def test_states_of_different_structures_are_never_read_as_a_default(tmp_path):
    """A stack whose clients' states differ in structure cannot give the loss one stacked state: reading it is an
    error that says why, not a silent ``.get`` default."""
    core, jobs, shared = _setup(tmp_path, "mixed_state")
    with pytest.raises(KeyError, match="differ in structure"):
        train_stack(core, jobs[:3], shared, [None] * 3, [None] * 3)
    assert len(train_stack(core, jobs[1:3], shared, [None] * 2, [None] * 2)) == 2  # one structure: stacked


@pytest.mark.parametrize("algorithm, extra", [("scaffold", {"train__momentum": 0}),
                                              ("scaffold", {"algorithm__control": 1}),
                                              ("feddyn", {"algorithm__max_grad_norm": 0.8})])
def test_new_and_returning_clients_share_a_cohort(tmp_path, monkeypatch, algorithm, extra):
    """Round 2 of an algorithm with client state (SCAFFOLD's c_i, FedDyn's λ_k): clients 0 and 2 return with what
    they kept in round 1, 1 and 3 are new (zeros from init_client_state), so their states have one structure and
    the loss reads them stacked; every client's upload, kept state and loss equal its one-at-a-time job's. FedDyn's
    gradient clip bites (the stack clips each client's norm on its own, as clip_grad_norm_ does)."""
    core, jobs, shared = _setup(tmp_path, algorithm, **extra)
    alg = core.algorithm
    first = {c: core.train(jobs[c], shared, None, None) for c in (0, 2)}
    server = alg.init_server_state({k: v.clone() for k, v in core.model(0).state_dict().items()})
    server = alg.server_aggregate([ClientUpdate(c, r.upload, r.num_samples) for c, (r, _) in first.items()],
                                  server, 1)
    shared2 = alg.server_payload(server, 2)
    jobs2 = [TrainJob(client_id=c, round=2, payload_ref=None) for c in range(4)]
    states = [first[0][1], None, first[2][1], None]
    norms: list[float] = []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", lambda *a, **k: norms.append(float(clip(*a, **k))))
    alone = [core.train(j, shared2, None, s) for j, s in zip(jobs2, states)]
    monkeypatch.undo()
    together = train_stack(core, jobs2, shared2, [None] * 4, states)
    for (r1, keep1), (r2, keep2) in zip(alone, together):
        assert _same_tree(r1.upload, r2.upload) and _same_tree(keep1, keep2)
        assert (r1.loss, r1.parts, r1.finite) == (r2.loss, r2.parts, r2.finite)
    if algorithm == "feddyn":
        assert max(norms) > 0.8 > min(norms)  # clipped on some steps, not on others
    else:
        assert all(any(bool(v.any()) for v in keep["control"].values()) for _, keep in together)  # c_i⁺ moved


def test_a_cnn_cohort_is_each_client_alone_bit_for_bit(tmp_path):
    """On a CPU each client's convolutions run as alone (forward and backward), the rest of the step batched:
    a CNN's stack equals one client at a time bit for bit too, clients of different sizes included."""
    core, jobs, shared = _setup(tmp_path, "fedavg", data__name="mnist", model__name="cnn", model__width=4,
                                train__local_epochs=1, clients__num=4)
    alone = [core.train(j, shared, None, None) for j in jobs]
    together = train_stack(core, jobs, shared, [None] * 4, [None] * 4)
    assert len({r.num_samples for r, _ in alone}) == 4
    for (r1, _), (r2, _) in zip(alone, together):
        assert _same_tree(r1.upload, r2.upload) and (r1.loss, r1.parts) == (r2.loss, r2.parts)


@register_model("bn_mlp")
def bn_mlp(*, input_shape, cfg, **_):
    """A test model with batch norm: its running statistics are buffers that every step updates in place."""
    width = int(torch.tensor(input_shape).prod())
    return nn.Sequential(nn.Flatten(), nn.Linear(width, 32), nn.BatchNorm1d(32), nn.ReLU(),
                         nn.Linear(32, cfg.feature_dim), nn.ReLU())


def test_batch_norm_statistics_are_each_clients_own(tmp_path):
    """Each client's running statistics are updated by its own batches (batch counts equal, statistics within
    float32 rounding: the stacked batch norm sums in another order)."""
    core, jobs, shared = _setup(tmp_path, "fedavg", model__name="bn_mlp", train__lr=0.01, clients__num=4)
    alone = [core.train(j, shared, None, None) for j in jobs]
    together = train_stack(core, jobs, shared, [None] * 4, [None] * 4)
    for (r1, _), (r2, _) in zip(alone, together):
        assert r1.upload["backbone.2.num_batches_tracked"] == r2.upload["backbone.2.num_batches_tracked"] > 1
        for key, value in r1.upload.items():
            torch.testing.assert_close(r2.upload[key], value, rtol=1e-4, atol=1e-5)
    first = together[0][0].upload["backbone.2.running_mean"]
    assert not torch.equal(first, together[1][0].upload["backbone.2.running_mean"])  # each its own


def test_fedbn_cohorts_keep_each_clients_batch_norm(tmp_path):
    """FedBN on cnn_bn: in a stack every client trains and keeps its own batch-norm layers, new clients (round 1)
    and returning ones (their kept layers loaded) alike, within float32 rounding of one client at a time."""
    # small plain steps, as in the test above: at lr 0.05 with momentum 0.9 the stacked batch norm's other summation
    # order grows to 2e-2 within one epoch of the larger clients (both ways are float32 rounding, amplified)
    core, jobs, shared = _setup(tmp_path, "fedbn", data__name="mnist", model__name="cnn_bn", model__width=4,
                                train__local_epochs=1, clients__num=4, train__momentum=0.0, train__lr=0.01)
    states: list = [None] * 4
    for round_ in (1, 2):
        jobs = [TrainJob(client_id=j.client_id, round=round_, payload_ref=None) for j in jobs]
        alone = [core.train(j, shared, None, s) for j, s in zip(jobs, states)]
        together = train_stack(core, jobs, shared, [None] * 4, states)
        for (r1, k1), (r2, k2) in zip(alone, together):
            assert k1.keys() == k2.keys() and k1 and not set(k1) & set(r1.upload)  # batch norm kept, not sent
            for mine, theirs in ((r1.upload, r2.upload), (k1, k2)):
                for key, value in mine.items():
                    torch.testing.assert_close(theirs[key], value, rtol=1e-4, atol=1e-5)
        means = [keep[next(k for k in keep if k.endswith("running_mean"))] for _, keep in together]
        assert not torch.equal(means[0], means[1])  # each client's own statistics
        states = [keep for _, keep in alone]


def test_one_clients_order_for_linear_layers_and_cross_entropy():
    """Under vmap, a linear layer's weight gradient and a batch-mean cross-entropy are computed in one client's
    summation order: stacked results equal per-client ones bit for bit, for batches across the kernel's cascade."""
    torch.manual_seed(0)
    layer = nn.Linear(16, 10)
    for batch in (1, 7, 16, 17, 40, 300):
        x = torch.randn(5, batch, 16)
        y = torch.randint(0, 10, (5, batch))
        w = torch.randn(5, 10, 16, requires_grad=True)
        b = torch.randn(5, 10, requires_grad=True)
        with OneClientOrder():
            stacked = vmap(lambda w_, b_, x_, y_: F.cross_entropy(
                functional_call(layer, {"weight": w_, "bias": b_}, (x_,)), y_))(w, b, x, y)
        gw, gb = torch.autograd.grad(stacked.sum(), (w, b))
        for k in range(5):
            wk, bk = w[k].detach().requires_grad_(), b[k].detach().requires_grad_()
            alone = F.cross_entropy(F.linear(x[k], wk, bk), y[k])
            assert torch.equal(stacked[k], alone)
            assert all(torch.equal(s, a) for s, a in zip((gw[k], gb[k]), torch.autograd.grad(alone, (wk, bk))))


def test_serial_linear_gradients_are_right():
    x = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: _SerialLinear.apply(*a), (x, w, b))
    assert torch.autograd.gradcheck(lambda x_, w_: _SerialLinear.apply(x_, w_, None), (x[0], w))


# ---------------------------------------------------------------------------------------------- whole runs
def _rows(tmp_path: Path, algorithm: str, vectorize: str, **extra: object) -> list[dict]:
    cfg = _cfg(tmp_path / vectorize, algorithm, engine__vectorize=vectorize, **extra)
    return [{k: v for k, v in r.items() if k != "vectorize"} for r in strip_timing(run_experiment(cfg)[1])]


@pytest.mark.parametrize("algorithm", SUPPORTED)
def test_every_supported_algorithm_has_identical_metrics_vectorised(tmp_path, algorithm):
    """Stacks of 4 (a round's 6 clients: 4 + 2) against one client at a time: every metric of every round equal."""
    off = _rows(tmp_path, algorithm, "off")
    assert len(off) == EXTRA.get(algorithm, {}).get("rounds", 2) and off[-1]["acc_mean"] is not None
    assert _rows(tmp_path, algorithm, "4") == off


@pytest.mark.parametrize("algorithm", ["fedprox", "unideal"])
def test_cohorts_with_every_upload_at_the_driver(tmp_path, algorithm):
    """engine.partial_sums=false: the per-client path (each client's own upload) with stacks, identical too."""
    off = _rows(tmp_path, algorithm, "off", engine__partial_sums="false")
    assert _rows(tmp_path, algorithm, "4", engine__partial_sums="false") == off


def test_cohorts_on_ray_workers_give_the_in_process_numbers(ray_cluster, tmp_path):
    """Two Ray workers, stacks of 3 of each client's own upload (stacked calls of single clients), and
    stacks of whole sum groups (stacked calls of groups): the metrics of one in-process run with stacks, and of
    one client at a time."""
    for partial in ("false", "true"):
        inline = _rows(tmp_path / partial, "fedprox", "3", engine__partial_sums=partial)
        on_ray = _rows(tmp_path / partial, "fedprox", "3", engine__partial_sums=partial, engine__backend="ray",
                       engine__num_workers=2, log__dir=str(tmp_path / partial / "ray"))
        assert on_ray == inline == _rows(tmp_path / partial, "fedprox", "off", engine__partial_sums=partial)


def test_auto_keeps_its_choice_and_changes_no_number(tmp_path, monkeypatch):
    """auto probes once, at the first round (nothing it trains is kept), keeps its choice in the checkpoint (not in
    the metrics: two identical runs may choose differently, by timing), and a resumed run takes it from there
    instead of probing again."""
    probes = []

    def counted(*args, **kwargs):
        probes.append(1)
        return 3, {}  # whatever the timing: a stack size the rest of the run must keep

    monkeypatch.setattr("raysim.engine.vectorize_probe.choose_stack_size", counted)
    monkeypatch.setattr("raysim.engine.vectorize_probe.probe_pays", lambda cfg: True)  # 3 rounds of 6 would not
    cfg = _cfg(tmp_path / "auto", "fedavg", engine__vectorize="auto", rounds=3)
    _, rows, _ = run_experiment(cfg)
    assert len(probes) == 1 and read_checkpoint(tmp_path / "auto" / "run")["vectorize"] == 3
    assert strip_timing(rows) == _rows(tmp_path, "fedavg", "off", rounds=3)  # the probe's choice is no metric
    longer = _cfg(tmp_path / "auto", "fedavg", engine__vectorize="auto", rounds=4)
    run_experiment(longer, resume=True)
    assert len(probes) == 1 and read_checkpoint(tmp_path / "auto" / "run")["vectorize"] == 3


def test_auto_probes_only_a_run_that_can_repay_the_probe(tmp_path):
    """The probe trains 3 + min(8, n) + 2·min(n, 128) client updates for a round of n clients; it runs only where
    that is at most a quarter of the run's rounds × n. Worked by hand: 6 clients a round, 21 updates against a
    quarter of 2 rounds' 12 (no: 21 > 3), of 14 rounds' 84 (yes: 21 <= 21) and of 13 rounds' 78 (no: 21 > 19.5);
    100 a round, 211 against a quarter of 10 rounds' 1,000 (yes: 211 <= 250) and of 8 rounds' 800 (no: 211 > 200).
    Below that, the run trains one at a time, unprobed."""
    def pays(num: int, fraction: float, rounds: int) -> bool:
        return vectorize_probe.probe_pays(load_config(None, [f"clients.num={num}", f"clients.fraction={fraction}",
                                                             f"rounds={rounds}"]))

    assert (pays(8, 0.75, 2), pays(8, 0.75, 14), pays(8, 0.75, 13)) == (False, True, False)
    assert (pays(1000, 0.1, 10), pays(1000, 0.1, 8)) == (True, False)
    cfg = _cfg(tmp_path, "fedavg")  # engine.vectorize is left to its default, auto; 2 rounds of 6 clients
    assert cfg.engine.vectorize == "auto"
    run_dir, rows, _ = run_experiment(cfg)
    assert read_checkpoint(run_dir)["vectorize"] == 1 and all("vectorize" not in r for r in rows)


def test_auto_measures_and_never_stacks_slow_clients(tmp_path, monkeypatch):
    core, jobs, shared = _setup(tmp_path, "fedavg")
    size, measured = vectorize_probe.choose_stack_size(core, jobs, shared, [None] * 8, [None] * 8)
    assert size in (1, 8) and measured["k"] == 8 and measured["serial_s"] > 0 and measured["stack_s"] > 0
    assert measured["bytes_per_client"] > sum(t.numel() * 4 for t in core.model(0).state_dict().values())
    monkeypatch.setattr(vectorize_probe, "AUTO_SLOW_JOB_S", 0.0)  # every client now counts as slow: no stack probe
    size, measured = vectorize_probe.choose_stack_size(core, jobs, shared, [None] * 8, [None] * 8)
    assert size == 1 and "stack_s" not in measured
    monkeypatch.setattr(vectorize_probe, "AUTO_MEMORY_BYTES", 1)  # nothing fits the budget
    assert vectorize_probe.choose_stack_size(core, jobs, shared, [None] * 8, [None] * 8)[0] == 1


def test_auto_stacks_only_what_gives_the_one_at_a_time_bits(tmp_path, monkeypatch):
    """auto never changes a number: with a clock that makes every stack look far faster, a batch-norm model (whose
    stack agrees only within rounding) stays one at a time, and so does a model whose probed stack differs from
    its clients trained alone by one bit; a stack that matches bit for bit is taken."""
    ticks = iter(range(10**6))
    monkeypatch.setattr(vectorize_probe, "_probe_clock", lambda device: lambda: float(next(ticks)))
    core, jobs, shared = _setup(tmp_path / "bn", "fedbn", model__name="cnn_bn", model__width=4)
    assert vectorize_probe.choose_stack_size(core, jobs, shared, [None] * 8, [None] * 8) == (1, {})

    def exact(*args):  # every client's numbers as alone: the stack's own timing decides
        return [core.train(j, shared, None, None) for j in args[1]]

    def one_bit_off(*args):
        out = exact(*args)
        out[-1][0].loss = float(torch.nextafter(torch.tensor(out[-1][0].loss, dtype=torch.float64),
                                                torch.tensor(1e9, dtype=torch.float64)))
        return out

    core, jobs, shared = _setup(tmp_path / "mlp", "fedavg")
    fast = iter([0.0, 0.1] * 8 + [0.0, 0.08, 0.0, 0.08])  # 0.1 s a client alone, 0.01 s in a stack of 8
    monkeypatch.setattr(vectorize_probe, "_probe_clock", lambda device: lambda: next(fast))
    monkeypatch.setattr(vectorize_probe, "train_stack", one_bit_off)
    size, measured = vectorize_probe.choose_stack_size(core, jobs, shared, [None] * 8, [None] * 8)
    assert size == 1 and measured["exact"] == 0.0 and measured["stack_s"] < measured["serial_s"]
    fast = iter([0.0, 0.1] * 8 + [0.0, 0.08, 0.0, 0.08])
    monkeypatch.setattr(vectorize_probe, "train_stack", exact)
    assert vectorize_probe.choose_stack_size(core, jobs, shared, [None] * 8, [None] * 8)[0] == 8


# ---------------------------------------------------------------------------------------------- what may vectorise
def test_declaring_vectorisable_hooks():
    def stacks(cls) -> bool:
        return cls.refusal("stack") is None

    assert all(stacks(get_algorithm(a)) for a in [*SUPPORTED, "fedbn"])  # fedbn: within float32 rounding
    assert not stacks(Algorithm) and not stacks(get_algorithm("moon"))

    class ServerSide(FedAvg):  # FedAvg's client hooks, its own aggregation: still vectorisable
        def server_aggregate(self, updates, server_state, round):
            return server_state

    class OwnLoss(FedAvg):  # a loss FedAvg's declaration never saw
        def client_loss(self, model, x, y, ctx):
            return super().client_loss(model, x, y, ctx)

    class Redeclared(OwnLoss):
        vectorizable = True

    assert stacks(ServerSide) and not stacks(OwnLoss) and stacks(Redeclared)
    assert "OwnLoss overrides client_loss" in OwnLoss.refusal("stack")


def test_notices_say_when_clients_train_one_at_a_time(tmp_path):
    def notices(*extra: str) -> list[str]:
        cfg = load_config(None, [*tiny_overrides(tmp_path), *extra], warn=False)
        return [w for w in config_warnings(cfg) if w.startswith("engine.vectorize")]

    assert notices("engine.vectorize=8", "algorithm.name=moon") == [
        "engine.vectorize=8: algorithm moon declares no vectorisable client hooks (Algorithm.vectorizable), so its "
        "clients train one at a time"]
    hete = notices("engine.vectorize=8", "algorithm.name=unideal", "model.name=mlp_hete")
    assert len(hete) == 1 and "own architecture (HETE)" in hete[0]
    assert notices("engine.vectorize=auto", "algorithm.name=moon") == []
    assert notices("engine.vectorize=off", "algorithm.name=moon") == notices("engine.vectorize=8") == []


def test_hete_and_unsupported_algorithms_fall_back_to_the_same_numbers(tmp_path):
    for algorithm, extra in (("moon", {"algorithm__out_dim": 16}), ("unideal", {"model__name": "mlp_hete"})):
        off = _rows(tmp_path / algorithm, algorithm, "off", **extra)
        assert _rows(tmp_path / algorithm, algorithm, "4", **extra) == off


def test_random_layers_are_refused_in_one_line(tmp_path):
    line = refused_config("engine.vectorize", *tiny_overrides(tmp_path), "plugins=[resmlp]", "model.name=resmlp",
                          "model.resmlp.dropout=0.2", "engine.vectorize=4", "engine.backend=inline")
    assert "Dropout" in line and "engine.vectorize=off" in line
    assert not (tmp_path / "run").exists()


def test_bad_settings_are_one_line(tmp_path):
    for bad in ("0", "on", "many"):
        refused_config("engine.vectorize", *tiny_overrides(tmp_path), f"engine.vectorize={bad}")
    assert load_config(None, ["engine.vectorize=off"]).engine.vectorize == "off"  # YAML's bare off is false
