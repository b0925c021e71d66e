"""Lamb under DeepSpeed ZeRO 0-3 on 1, 2 and 4 gloo ranks equals a float64, unpartitioned reference LAMB.

On 2 ranks also ZeRO 2 and 3 with the optimizer offloaded to cpu, and the real encoder (tiny-albert) at ZeRO 2.
One launch per world size (tests/lamb_zero_worker.py trains every stage in turn and writes the final parameters; the
ranks are forked with torchrun's environment, tests/fork_server.py run_ranks);
the reference is ``test_lamb.reference_lamb`` run here on the same model, data, gradient clipping and global batch.
Also: the same optimizer without ``bind_zero_layout`` (a naive per-partition LAMB) fails the comparison; in bf16
(ZeRO-1's BF16_Optimizer, ZeRO 2, ZeRO 3) one step replayed from DeepSpeed's own fp32 masters, gradients and moments
equals the reference step; a ZeRO-2 save at step 10 and resume is bit-identical to an uninterrupted run; a universal
checkpoint resumes 2 ranks -> 1.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fork_server  # noqa: E402
import lamb_zero_worker as worker  # noqa: E402
from test_lamb import clip_reference, reference_lamb  # noqa: E402


# fp32 against float64 after 20 steps at lr 2e-2 differs by ~4e-5 at most (measured 2.6e-5 .. 4.5e-5 over every
# stage and world size); a naive per-partition LAMB is off by ~0.5.
ATOL = 1e-4

pytestmark = pytest.mark.multiproc


def _launch(nproc: int, out: Path, *args: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    worker_cmd = [str(HERE / "lamb_zero_worker.py"), "--out", str(out), *args]
    # The ranks are forks of a process that has imported torch and DeepSpeed, with torchrun's environment and
    # rendezvous (tests/fork_server.py run_ranks): what is compared here is the optimizer's arithmetic across ranks
    # and ZeRO stages, not the launcher (tests/test_preemption.py, test_trainer_multiproc.py and the Slurm tests
    # launch torchrun itself).
    cmd = [sys.executable, *worker_cmd]
    proc = fork_server.run_ranks(cmd, nproc, cwd=out.parent, env=env, timeout=600)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-6000:]}")
    return torch.load(out, weights_only=False)


# The worker models' parameters that LAMB leaves without weight decay and with trust ratio 1 (biases and LayerNorm
# weights, as ALBERT's exclude_from_layer_adaptation names them), written out here rather than taken from the
# product's excluded_names(): a wrong exclusion rule would otherwise pass on both sides.
EXCLUDED = {
    "stand-in": {"emb_ln.weight", "emb_ln.bias", "head.bias"} | {
        f"blocks.{i}.{name}" for i in (0, 1)
        for name in ("qkv.bias", "out.bias", "ln1.weight", "ln1.bias", "up.bias", "down.bias", "ln2.weight",
                     "ln2.bias")},
    "tiny-albert": {f"model.{name}" for name in (
        "encoder.embeddings.norm.weight", "encoder.embeddings.norm.bias", "encoder.project.bias",
        "encoder.attention.0.qkv.bias", "encoder.attention.0.out.bias", "encoder.attention.0.norm.weight",
        "encoder.attention.0.norm.bias", "encoder.ffn.0.inner.bias", "encoder.ffn.0.outer.bias",
        "encoder.ffn.0.norm.weight", "encoder.ffn.0.norm.bias", "heads.mlm.dense.bias", "heads.mlm.norm.weight",
        "heads.mlm.norm.bias", "heads.mlm.decoder.bias", "heads.sop.pooler.bias", "heads.sop.classifier.bias")},
}


def _reference(model_name: str = "stand-in") -> dict[str, torch.Tensor]:
    worker.MODEL = model_name
    try:
        model = worker.make_model().double()
    finally:
        worker.MODEL = "stand-in"
    params = dict(model.named_parameters())
    excluded, state = EXCLUDED[model_name], {}
    assert excluded <= set(params), sorted(excluded - set(params))
    for step in range(worker.STEPS):
        model.zero_grad()
        model(*worker.global_batch(step)).backward()
        with torch.no_grad():
            grads = {n: p.grad for n, p in params.items()}
            clip_reference(grads, worker.CLIP)
            reference_lamb(params, grads, state, excluded=excluded, **worker.HP)
    return {n: p.detach().clone() for n, p in params.items()}


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return _reference()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Results per world size, launched on first use (so `-k world4` starts only the 4-rank job)."""
    cache, root = {}, tmp_path_factory.mktemp("lamb_zero")
    args = {1: ["--naive", "2"],
            2: ["--naive", "2", "--resume-dir", str(root / "ckpt"), "--bf16", "1,2,3", "--bf16-naive", "1",
                "--offload", "2,3", "--albert-stages", "2"],
            4: ["--naive", "3"]}

    def get(world: int) -> dict:
        if world not in cache:
            cache[world] = _launch(world, root / f"world{world}.pt", "--stages", "0,1,2,3", *args[world])
        return cache[world]
    get.root = root
    return get


def _max_diff(params: dict, reference: dict) -> float:
    assert params.keys() == reference.keys()
    return max((params[n].double() - reference[n]).abs().max().item() for n in reference)


def _check_world(runs, reference, world):
    results = runs(world)
    for stage in range(4):
        diff = _max_diff(results[f"zero{stage}"]["params"], reference)
        assert diff < ATOL, f"ZeRO-{stage} on {world} ranks: max |ours - float64 reference| = {diff:.2e}"
    moved = _max_diff(dict(worker.make_model().named_parameters()), reference)
    assert moved > 100 * ATOL  # the comparison is about a trained model, not the initial one
    return results


@pytest.mark.slow
def test_real_tiny_albert_on_two_ranks_matches_reference(runs):
    """The project's encoder (tiny-albert: shared layers, factorized and tied embeddings) at ZeRO 2 (issue 6's
    "a tiny ALBERT trains with it on 2 ranks under ZeRO-2"; ZeRO 3 passes too, left out for time), in the 2-rank
    launch of ``runs`` after the stand-in's configurations."""
    results = runs(2)
    reference = _reference("tiny-albert")
    for stage in (2,):
        diff = _max_diff(results[f"albert_zero{stage}"]["params"], reference)
        assert diff < ATOL, f"tiny-albert ZeRO-{stage} on 2 ranks: max |ours - reference| = {diff:.2e}"
    assert results["albert_zero2"]["cut_on_rank0"] > 0


def test_lamb_zero_stages_on_one_rank_match_reference(runs, reference):
    _check_world(runs, reference, 1)


@pytest.mark.slow
def test_lamb_zero_stages_on_two_ranks_match_reference(runs, reference):
    results = _check_world(runs, reference, 2)
    assert results["zero1"]["cut_on_rank0"] > 0 and results["zero2"]["cut_on_rank0"] > 0
    for stage in (2, 3):  # ZeRO-Offload: DeepSpeed steps Lamb on the CPU copies of the partitions
        diff = _max_diff(results[f"offload{stage}"]["params"], reference)
        assert diff < ATOL, f"ZeRO-{stage} with optimizer offload on 2 ranks: max |ours - reference| = {diff:.2e}"


@pytest.mark.slow
def test_lamb_zero_stages_on_four_ranks_match_reference(runs, reference):
    results = _check_world(runs, reference, 4)
    assert results["zero2"]["cut_on_rank0"] > 0


@pytest.mark.parametrize("world, stage", [(1, 2), (2, 2), (4, 3)])
def test_naive_per_partition_lamb_fails_the_reference(runs, reference, world, stage):
    diff = _max_diff(runs(world)[f"naive{stage}"]["params"], reference)
    assert diff > 100 * ATOL, f"a per-partition trust ratio should be visibly wrong, got {diff:.2e}"


def _replay_bf16_step(record) -> float:
    """Max |DeepSpeed's fp32 masters after the step - the reference step from the same masters, grads, moments|."""
    before = record["before"]
    params = {n: x["w"].double().clone() for n, x in before.items()}
    state = {n: {"t": record["t"], "m": x["m"].double(), "v": x["v"].double()} for n, x in before.items()}
    excluded = EXCLUDED["stand-in"]
    reference_lamb(params, {n: x["g"].double() for n, x in before.items()}, state, excluded=excluded, **worker.HP)
    return max((record["after"][n].double() - params[n]).abs().max().item() for n in params)


@pytest.mark.parametrize("stage, wrapper", [(1, "BF16_Optimizer"), (2, "DeepSpeedZeroOptimizer"),
                                            (3, "DeepSpeedZeroOptimizer_Stage3")])
def test_bf16_step_on_two_ranks_is_the_reference_step(runs, stage, wrapper):
    results = runs(2)
    bound = results[f"bf16_zero{stage}"]
    assert bound["wrapper"] == wrapper
    # measured ~1e-7 (fp32 masters) for the bound optimizer and ~2e-2 for a naive one (checked at ZeRO-1 below)
    assert _replay_bf16_step(bound) < 1e-5


def test_bf16_replay_catches_a_naive_lamb(runs):
    naive = runs(2)["bf16_naive1"]
    assert naive["wrapper"] == "BF16_Optimizer"
    assert _replay_bf16_step(naive) > 1e-3


def test_zero2_save_and_resume_is_bit_identical(runs):
    results = runs(2)
    straight, resumed = results["zero2"], results["resumed2"]
    assert resumed["losses"] == straight["losses"]
    for name, p in straight["params"].items():
        assert torch.equal(p, resumed["params"][name]), f"{name} differs after save at step 10 and resume"


@pytest.mark.slow
def test_universal_checkpoint_resumes_two_ranks_on_one(runs, reference):
    runs(2)  # writes ckpt/global_step10 at ZeRO-2 on 2 ranks
    ckpt = runs.root / "ckpt"
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                    "--input_folder", str(ckpt / "global_step10"),
                    "--output_folder", str(ckpt / "global_step10_universal"), "--inject_missing_state"],
                   check=True, capture_output=True, env=dict(os.environ, PYTHONWARNINGS="ignore"), timeout=300)
    for state in ("exp_avg", "exp_avg_sq", "step"):  # our state is what the converter reshards
        assert (ckpt / "global_step10_universal" / "zero" / "blocks.0.qkv.weight" / f"{state}.pt").exists()
    results = _launch(1, runs.root / "universal.pt", "--stages", "", "--load-universal", str(ckpt))
    diff = _max_diff(results["universal2"]["params"], reference)
    assert diff < ATOL, f"2 ranks -> universal -> 1 rank: max |ours - reference| = {diff:.2e}"
