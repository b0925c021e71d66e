"""The training loop: ``train()`` -> ``train_step()`` -> one forward/backward per micro-batch, DeepSpeed steps.

Per optimizer step every rank runs ``gradient_accumulation_steps`` micro-batches, then ONE all-reduce of a small
vector carries the loss and metric sums, the token count, the non-finite count, the preemption flag and whether rank
0's lock of the run folder was taken over, so logging, the NaN guard, the "save now" and "stop now" decisions cost no
extra collective and every rank agrees on them.

Exit statuses of a run (``trainer/pretrain.py`` returns them): ``trainer/run_status.py``.
"""
from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from trainer import checkpoint
from trainer.config import RunConfig, checkpoint_dir
from trainer.metrics import MetricsLogger
from trainer.objectives.base import metric_parts
from trainer.run_lock import RunLock, RunLockLostError
from trainer.run_status import EXIT_ERROR, EXIT_OK, EXIT_REQUEUE, note_step, write_status

if TYPE_CHECKING:  # the engine imports deepspeed; objectives build Components without it
    from trainer.engine import Engine
    from trainer.finetune.downstream import DownstreamLauncher


@dataclass
class Components:
    """What the loop needs from the model, objective and data packages (built by ``pretrain.build_components``)."""
    model: torch.nn.Module
    loss: Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict[str, torch.Tensor]]]
    """objective.loss(model, batch) -> (loss, metrics)."""
    train_batches: Callable[[int, int], Iterator[dict]]
    """(consumed_samples, end_samples) -> this rank's micro-batches of the global positions [consumed_samples,
    end_samples) (DESIGN.md "Samples"). The end is the loop's: the steps left times this launch's global batch."""
    eval_batches: Callable[[], Iterable[dict]] | None = None
    """This rank's held-out micro-batches (the same ones at every evaluation)."""
    flops_per_token: float = 0.0
    """Training FLOPs per real token of ``model`` (``trainer.flops.TrainFlops.per_token``), for MFU; 0 = not logged.
    With ``attention_flops`` 0 it is the whole count per token (a full-row figure, e.g. the stand-in's 6 x params)."""
    attention_flops: float = 0.0
    """Training FLOPs per squared attended-segment length (``TrainFlops.per_square``): MFU counts attention for the
    rows as computed (``attended_squares``), not at ``data.max_seq_length``."""


@dataclass
class StepResult:
    loss: float
    metrics: dict[str, float]
    tokens: int
    nonfinite: bool
    preempt: bool
    seconds: float
    data_wait: float = 0.0
    """Host seconds this rank waited for its micro-batches (``next(batches)``) in this step."""
    rank_times: list[tuple[float, float]] | None = None
    """On logging steps: every rank's (step seconds, data-wait seconds) over the logging window up to this step's
    all-reduce, riding that all-reduce (each rank fills its own slots); None on other steps."""
    lost_folder: bool = False
    """Rank 0's run lock was taken over by another launch (``RunLock.lost``): every rank stops at once."""
    heartbeat_dead: bool = False
    """Rank 0's lock heartbeat failed (``RunLock.trouble``): every rank stops before the lock looks stale."""
    attended_squares: float = 0.0
    """Sum over every rank's micro-batches of ``attended_squares`` (the attention part of MFU)."""
    grad_norm: torch.Tensor | None = None
    """The gradient norm before clipping, on the device, measured by the loop where DeepSpeed keeps none (ZeRO-0) and
    only on steps that log (``Trainer._grad_norm``); read on the host by ``_log`` only."""


class NonFiniteLossError(RuntimeError):
    pass



class PreemptionFlag:
    """SIGTERM / SIGUSR1 set a flag; the loop saves at the next step boundary (a handler must not do work)."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGUSR1)):
        self.requested = False
        self.signum = None
        for sig in signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True
        self.signum = signum


_NARROW_INTS = (torch.int8, torch.int16, torch.int32, torch.uint8)


def _to_device(batch: dict, device) -> dict:
    """The batch on ``device``, with its ``Packing`` computed first on the host if the collator did not (there
    finding the real tokens costs no device sync: ``trainer.models.kernels.attach_packing``), and its compact integer
    tensors (int32/int8 from the collators, ``trainer.data.loader``) widened to int64 after the copy, on the device:
    the dtypes of DESIGN.md "Batches". The packing's own tensors keep theirs (flash-attn takes int32 cu_seqlens)."""
    from trainer.models.kernels import Packing, attach_packing

    def move(v):
        if isinstance(v, Packing):
            return v.to(device, non_blocking=True)
        if not torch.is_tensor(v):
            return v
        v = v.to(device, non_blocking=True)
        return v.long() if v.dtype in _NARROW_INTS else v

    return {k: move(v) for k, v in attach_packing(batch).items()}


def attended_squares(batch: dict) -> int:
    """Sum of length^2 over the segments attention works on in ``batch`` (host metadata only: no device read).

    What counts as useful work: each real token attending to the real tokens of its own segment. A packed row
    (``pack_ids``) counts each packed sample's length^2 (attention is restricted per sample, varlen or block mask);
    a padded row counts its real length^2: the padding positions a dense masked SDPA also computes are not counted,
    as the token count leaves padding out. Read from the ``Packing`` the loader workers attached
    (``Packing.attended_squares``). A batch without an attention mask has full rows: rows x seq_len^2. A batch whose
    mask came without a host packing (already on the device) is counted at full rows too (reading it would sync): it
    overstates attention as the count before the split did."""
    packing = batch.get("packing")
    if packing is not None:
        return packing.attended_squares
    ids = batch["input_ids"]
    seqlen = ids.shape[-1]
    return ids.numel() * seqlen


@dataclass
class Trainer:
    cfg: RunConfig
    engine: Engine
    comps: Components
    state: checkpoint.TrainState
    rank: int
    world_size: int
    grad_accum: int
    metrics: MetricsLogger
    preempt: PreemptionFlag
    peak_flops: float = 0.0
    """Per-rank peak FLOP/s, the denominator of MFU (0 = not logged)."""
    recent_losses: list = field(default_factory=list)
    downstream: DownstreamLauncher | None = None
    """Fine-tunes copies of checkpoints in separate processes (``eval.downstream``), or None."""
    run_lock: RunLock | None = None
    """Rank 0's lock of the run folder (``trainer.run_lock``); None on the other ranks."""
    run_id: str = ""
    """This run's lineage id (``checkpoint.begin_lineage``), stored in every checkpoint it saves."""
    last_checkpoint: Path | None = None
    """The newest checkpoint of this run: the one resumed from, then each one saved. No checkpoint is saved while a
    NaN/Inf streak is open, so this is the one to go back to when the guard stops the run."""
    nonfinite_streak: int = 0
    """Steps in a row (up to the current one) whose loss or gradient was NaN/Inf and that were skipped."""
    save_seconds: float = 0.0
    """Seconds spent saving checkpoints since the last train record (logged as ``save_s``, then reset)."""
    eval_seconds: float = 0.0
    """Seconds spent evaluating since the last train record (logged as ``eval_s``, then reset)."""
    last_record_time: float = 0.0
    """time.time() of the last train record of this launch (0: none yet): ``window_s`` counts from it."""
    last_every_s: float | None = None
    """Wall seconds of the last logging interval: status.json carries it on every ``running`` write (the save's
    too), so a script reading that file alone can apply the staleness rule (run_status.py)."""
    saved_step: int = -1
    """The step this launch last saved: a second ``save()`` for it (a downstream step on a periodic save) returns
    the checkpoint without saying or timing a save again."""

    # --- one step -----------------------------------------------------------------------------------------------

    def train_step(self, batches: Iterator[dict], logs: bool = False,
                   window: tuple[float, float] = (0.0, 0.0)) -> StepResult:
        """One optimizer step. ``logs``: this step's record will be logged (the gradient norm is measured for it, and
        every rank's window timings ride the all-reduce); ``window``: this rank's (step seconds, data-wait seconds) of
        the logging window before this step."""
        from trainer.models.kernels import attach_packing

        start = time.perf_counter()
        waited = 0.0  # host clock around next(batches): no device sync
        device = self.engine.device
        # Sums stay on the device until the one all-reduce below: no host sync per micro-batch.
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        metric_sums: dict[str, torch.Tensor] = {}
        tokens = torch.zeros((), dtype=torch.float64, device=device)
        squares = 0  # host int: from the loader's metadata (attended_squares), summed over ranks with the rest
        # DeepSpeed's ZeRO-0 engine keeps no gradient norm (get_global_grad_norm() is None): measure it here, on the
        # steps that log it only (a few small kernels; the value stays on the device until _log)
        measure = logs and self.engine.zero_stage == 0
        grad_norm = None
        for i in range(self.grad_accum):
            asked = time.perf_counter()
            host = next(batches)
            waited += time.perf_counter() - asked
            host = attach_packing(host)  # a no-op when the loader workers attached it (they do)
            squares += attended_squares(host)
            batch = _to_device(host, device)
            mask = batch.get("attention_mask")
            tokens += mask.sum() if mask is not None else batch["input_ids"].numel()
            loss, metrics = self.engine(self.comps.loss, batch)
            self.engine.backward(loss)
            if measure and i == self.grad_accum - 1:  # the boundary: gradients all-reduced, not yet clipped or applied
                grad_norm = self._grad_norm()
            self.engine.step()  # DeepSpeed applies the update only at the accumulation boundary
            loss_sum += loss.detach().double()
            for k, v in metrics.items():  # [sum, count] pairs (objectives/base.py: metric_parts)
                metric_sums[k] = metric_sums.get(k, 0.0) + metric_parts(torch.as_tensor(v, device=device))
        keys = sorted(metric_sums)
        # fp16 loss-scale overflow skips are the scaler's routine, not a non-finite step (Engine docstring)
        trouble = self.run_lock.trouble if self.run_lock is not None else None
        lost = 0.0 if trouble is None else 1.0 if trouble == "lost" else 2.0  # 2: the heartbeat died
        # Made on the device and set only when raised: torch.tensor([...], device=cuda) would copy from pageable host
        # memory every step (a synchronous copy); a fill of a device tensor is a kernel launch.
        # (The attended squares ride along: float64 holds them exactly, to 2^53.)
        flags = torch.zeros(4, dtype=torch.float64, device=device)
        for i, value in enumerate((float(squares), lost, float(self.engine.unhandled_nonfinite_step()),
                                   float(self.preempt.requested))):
            if value:
                flags[i] = value
        # On logging steps only: every rank's window timings, each rank filling its own two of 2 x world_size slots
        # (zeros elsewhere), so the sum gives all of them: 16 bytes a rank in the same all-reduce, no collective more.
        timings = []
        if logs:
            timings = [torch.zeros(2 * self.world_size, dtype=torch.float64, device=device)]
            timings[0][self.rank] = window[0] + time.perf_counter() - start
            timings[0][self.world_size + self.rank] = window[1] + waited
        # One collective for everything the ranks must agree on (on the device: NCCL reduces only device tensors).
        # note: the .tolist() below is the step's one device-to-host sync point.
        packed = torch.cat([loss_sum.reshape(1), *(metric_sums[k] for k in keys), tokens.reshape(1), flags,
                            *timings])
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(packed)
        values = packed.tolist()
        rank_times = None
        if logs:
            ws = self.world_size
            rank_times = list(zip(values[-2 * ws:-ws], values[-ws:]))
            values = values[:-2 * ws]
        n = self.grad_accum * self.world_size
        loss = values[0] / n
        # each metric pooled over every micro-batch and rank: its summed numerator over its summed count
        parts = {k: (values[1 + 2 * i], values[2 + 2 * i]) for i, k in enumerate(keys)}
        metrics = {k: s / c for k, (s, c) in parts.items() if c > 0}
        skipped = values[-2] > 0 or not math.isfinite(loss)
        return StepResult(loss=loss, metrics=metrics, tokens=int(values[-5]), nonfinite=bool(skipped),
                          preempt=values[-1] > 0, seconds=time.perf_counter() - start, data_wait=waited,
                          rank_times=rank_times, lost_folder=values[-3] == 1,
                          heartbeat_dead=values[-3] >= 2, grad_norm=grad_norm, attended_squares=values[-4])

    def _grad_norm(self) -> torch.Tensor | None:
        """L2 norm of the model's gradients (before clipping), as a device tensor: no host sync. At ZeRO-0 every
        rank holds the whole averaged gradient after the boundary's all-reduce, so no collective is needed."""
        grads = [p.grad for p in self.comps.model.parameters() if p.grad is not None]
        if not grads:
            return None
        return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads]))

    # --- evaluation ---------------------------------------------------------------------------------------------

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Every metric over the held-out micro-batches that report it, over all ranks: a ``pooled`` metric (losses and
        accuracies over masked tokens, sentence labels, ...) as its summed numerator over its summed count, so the same
        set scores the same at any micro-batch size and world size; ``loss`` (the objective's weighted sum of its
        terms' per-micro-batch means) and any plain 0-dim metric as the mean over micro-batches. Batches may differ in
        what they report (ERNIE's DLM batches, one ERNIE 2.0 task per batch), so each key is pooled over its own
        batches, never diluted by batches without it.

        The training RNG streams are left as they were (``fork_rng``): an objective that samples at evaluation
        (ELECTRA's generator, ``gumbel_sample``) would otherwise shift the next step's dropout and sampling, and a run
        preempted at an evaluation step (it saves and stops before evaluating) would not resume onto the uninterrupted
        run's losses."""
        device = torch.device(self.engine.device)
        accelerators = [] if device.type == "cpu" else [device.index or 0]
        with torch.random.fork_rng(devices=accelerators, device_type="cuda" if device.type == "cpu" else device.type):
            return self._evaluate()

    def _evaluate(self) -> dict[str, float]:
        self.engine.train(False)
        sums: dict[str, float] = {}
        counts: dict[str, float] = {}
        for i, batch in enumerate(self.comps.eval_batches()):
            if i >= self.cfg.train.eval_batches * self.grad_accum:  # eval_batches steps' worth (pretrain.py)
                break
            loss, metrics = self.engine(self.comps.loss, _to_device(batch, self.engine.device))
            for k, v in {"loss": loss, **metrics}.items():
                s, c = metric_parts(v).tolist()
                sums[k] = sums.get(k, 0.0) + s
                counts[k] = counts.get(k, 0.0) + c
        self.engine.train(True)
        keys = sorted(sums)
        if dist.is_initialized() and self.world_size > 1:  # ranks may have seen different keys: agree on the union
            gathered: list = [None] * self.world_size
            dist.all_gather_object(gathered, keys)
            keys = sorted(set().union(*gathered))
        packed = torch.tensor([sums.get(k, 0.0) for k in keys] + [float(counts.get(k, 0)) for k in keys],
                              dtype=torch.float64, device=self.engine.device)
        if dist.is_initialized() and self.world_size > 1:
            dist.all_reduce(packed)
        values, n = packed[:len(keys)].tolist(), packed[len(keys):].tolist()
        return {k: values[i] / n[i] for i, k in enumerate(keys) if n[i] > 0}

    # --- the run ------------------------------------------------------------------------------------------------

    @property
    def fence(self):
        """The check before any write into the run's folders: the lock is still ours (``RunLock.check``)."""
        return self.run_lock.check if self.run_lock is not None else None

    def save(self) -> Path:
        """Save this step's checkpoint (returns at once if it exists). Callers check ``may_save`` first."""
        protect = Path(self.state.before_streak) if self.nonfinite_streak and self.state.before_streak else None
        repeated = getattr(self, "saved_step", -1) == self.state.step  # (a fence read and a broadcast, no save)
        started = time.perf_counter()
        self.last_checkpoint = checkpoint.save(
            self.engine, checkpoint_dir(self.cfg), self.state, self.cfg.model_dump(mode="json"), self.rank,
            self.world_size, self.cfg.checkpoint.keep_last, run_id=self.run_id, fence=self.fence,
            protect=protect)  # (see may_save)
        seconds = time.perf_counter() - started
        self.saved_step = self.state.step
        if not repeated:  # (timing it as "> 1 ms" took 0.5-7 ms repeats for saves: second diff review)
            self.save_seconds += seconds
            self.metrics.message(f"step {self.state.step}: checkpoint saved to {self.last_checkpoint} in "
                                 f"{seconds:.1f} s")
        # status.json follows the run at each save (one small file on rank 0; every step would cost a write per step).
        # A failed write of it (a transient NFS or quota error) is said, not raised: rank 0 alone leaving the loop
        # after a good checkpoint would leave the other ranks in the next step's collective (and a preemption would
        # exit 1, not 75). The run lock's fence still raises.
        try:
            write_status(self.cfg.run_dir, self.rank, "running", self.state.step, fence=self.fence,
                         total_steps=self.cfg.train.steps, every_s=getattr(self, "last_every_s", None))
        except OSError as err:
            self.metrics.message(f"warning: could not update {self.cfg.run_dir}/status.json after saving step "
                                 f"{self.state.step}: {err}")
        return self.last_checkpoint

    def may_save(self, why: str, ends_launch: bool = False) -> bool:
        """Whether to save now. While a NaN/Inf streak is open, the periodic and downstream checkpoints are not saved,
        said: the weights may already be spoiled (the streak's cause), and keep-last pruning would drop the good ones
        for them. The checkpoint that ends a launch (final, train.stop_at_step, preemption) is saved: without it a
        completed run would have no checkpoint of its last step, a stop_at_step relaunch would redo the same steps
        forever and a preemption would lose up to every_steps steps; skipped steps left the weights as they were, and
        ``save`` then protects the checkpoint saved before the streak (``state.before_streak``, kept in the saved
        state, so a later launch protects and names it too) from pruning."""
        if not self.nonfinite_streak:
            return True
        if ends_launch:
            self.metrics.message(f"step {self.state.step}: {why} saved during a NaN/Inf streak of "
                                 f"{self.nonfinite_streak} step(s); the checkpoint before it, {self._before_name()}, is "
                                 "kept: if the next launch stops on NaN/Inf, resume from that one")
            return True
        self.metrics.message(f"step {self.state.step}: {why} not saved: the last {self.nonfinite_streak} step(s) "
                             f"had a NaN/Inf loss or gradient (the newest checkpoint stays {self._last_name()})")
        return False

    def _downstream_at_preemption(self, saved: Path | None) -> None:
        """Queue the preemption checkpoint for downstream fine-tuning when its step is due (the next launch starts
        it), unless it was saved during a NaN/Inf streak (``may_save`` lets the launch-ending save through): weights
        that may be spoiled would be scored as the run's."""
        step = self.state.step
        if saved is None or not self.downstream.due(step):
            return
        if self.nonfinite_streak:
            self.metrics.message(f"step {step}: no downstream fine-tuning of the preemption checkpoint: it was saved "
                                 f"during a NaN/Inf streak of {self.nonfinite_streak} step(s)")
            return
        self.downstream.launch(step, saved, start=False)

    def _last_name(self) -> str:
        return str(self.last_checkpoint) if self.last_checkpoint is not None else "none: nothing saved yet"

    def _before_name(self) -> str:
        """The checkpoint saved before the open NaN/Inf streak (it may have begun in an earlier launch)."""
        return self.state.before_streak or "none: nothing saved before it"

    def _nonfinite(self, result: StepResult, in_a_row: int) -> None:
        self.metrics.message(f"step {self.state.step}: non-finite loss or gradient (loss={result.loss}); step "
                             f"skipped ({in_a_row} in a row, {self.state.skipped_steps} in this run)")
        limit = self.cfg.train.max_nonfinite_in_a_row
        if in_a_row >= limit:
            raise NonFiniteLossError(
                f"stopping at step {self.state.step}: {in_a_row} steps in a row had a NaN/Inf loss or gradient "
                f"(train.max_nonfinite_in_a_row={limit}). Losses of the last steps: {self.recent_losses[-limit-3:]}. "
                "What to try: lower optim.lr or lengthen schedule.warmup_steps; keep optim.grad_clip on (1.0); use "
                "bf16 rather than fp16; check the data near this step (consumed_samples="
                f"{self.state.consumed_samples}); " + (
                    f"resume from the last checkpoint saved before the streak with --resume {self.state.before_streak}"
                    + (f" (checkpoints saved during it, by the end of a launch, hold the skipped steps' weights: "
                       f"{self.last_checkpoint} is one)" if str(self.last_checkpoint) != self.state.before_streak
                       else " (nothing was saved during it)") if self.state.before_streak else
                    "no checkpoint was saved before the streak: start again with --resume none") + ".")

    def train(self) -> int:
        cfg, state = self.cfg, self.state
        if cfg.train.stop_at_step and cfg.train.stop_at_step <= state.step < cfg.train.steps:
            # a relaunch of the stopped command: it trained one more step per launch (and its save pruned a regular
            # checkpoint) before it stopped again
            self.metrics.message(f"nothing to train: resumed at step {state.step}, train.stop_at_step="
                                 f"{cfg.train.stop_at_step}; raise or unset train.stop_at_step to continue")
            write_status(cfg.run_dir, self.rank, "stopped", state.step, fence=self.fence,
                         total_steps=cfg.train.steps)
            if self.downstream is not None:
                self.downstream.suspend()  # says what waits for the launch that continues the run
            return EXIT_OK
        # Not train.steps x global batch: a resume with another train.global_batch_size (pretrain.py
        # global_batch_change) has consumed another number of samples by its step than that product says.
        end = state.consumed_samples + (cfg.train.steps - state.step) * cfg.train.global_batch_size
        batches = self.comps.train_batches(state.consumed_samples, end)
        last_saved = state.step
        # a streak a preemption cut goes on counting: the guard's limit and may_save see the steps before the save too
        in_a_row = self.nonfinite_streak = state.nonfinite_in_a_row
        window_tokens, window_squares, window_time, window_steps, window_wait = 0, 0.0, 0.0, 0, 0.0
        self.last_record_time = time.time()
        while state.step < cfg.train.steps:
            lr = self.engine.lr()
            step = state.step + 1
            result = self.train_step(batches, logs=step % cfg.logging.every_steps == 0 or step == cfg.train.steps,
                                     window=(window_time, window_wait))
            if result.lost_folder:  # another launch owns the folder now: write nothing more into it
                raise RunLockLostError(
                    f"stopping at step {state.step + 1}: another launch took over the run folder {cfg.run_dir} "
                    f"while this run was alive (its lock heartbeats stalled for longer than "
                    f"checkpoint.lock_stale_s = {cfg.checkpoint.lock_stale_s:g} s). This run writes nothing more "
                    "there: no metrics, checkpoint or status; the other launch continues from the last checkpoint. "
                    "If this happens without a stall, raise checkpoint.lock_stale_s.")
            if result.heartbeat_dead:  # stop before another launch sees a stale lock and takes the folder
                message = (f"stopping at step {state.step + 1}: rank 0's run lock heartbeat failed "
                           f"({self.run_lock.trouble if self.run_lock else 'see rank 0'}); a new launch would take "
                           "the folder over while this run still writes to it. Resume with --resume auto")
                write_status(cfg.run_dir, self.rank, "failed", state.step, message, fence=self.fence)
                raise RunLockLostError(message)
            state.step += 1
            state.consumed_samples += cfg.train.global_batch_size
            note_step(state.step)  # for the status of a failure after this point (pretrain.main)
            self.recent_losses = (self.recent_losses + [result.loss])[-20:]
            in_a_row = in_a_row + 1 if result.nonfinite else 0
            if in_a_row == 1:  # a streak begins: the checkpoint to protect and name is the newest one saved
                state.before_streak = str(self.last_checkpoint) if self.last_checkpoint is not None else ""
            elif in_a_row == 0:
                state.before_streak = ""
            self.nonfinite_streak = state.nonfinite_in_a_row = in_a_row
            if result.nonfinite:
                state.skipped_steps += 1
            window_tokens += result.tokens
            window_squares += result.attended_squares
            window_time += result.seconds
            window_wait += result.data_wait
            window_steps += 1
            self.metrics.advance(1, result.loss)
            if state.step % cfg.logging.every_steps == 0 or state.step == cfg.train.steps:
                self._log(result, lr, window_tokens, window_time, window_steps, window_squares, window_wait)
                window_tokens, window_squares, window_time, window_steps, window_wait = 0, 0.0, 0.0, 0, 0.0
            if result.nonfinite:
                self._nonfinite(result, in_a_row)  # raises after K in a row
            if result.preempt:  # save first and only: evaluation would eat into the scheduler's grace (KillWait)
                saved = self.save() if self.may_save("preemption checkpoint", ends_launch=True) else None
                if self.downstream is not None:  # a due step is queued (hard links: quick); the next launch starts it
                    self._downstream_at_preemption(saved)
                    self.downstream.suspend()
                said = "checkpoint saved" if saved is not None else f"the next launch resumes from {self._last_name()}"
                self.metrics.message(f"preempted at step {state.step}: {said}; exiting with status "
                                     f"{EXIT_REQUEUE} (requeue and run again with --resume auto)")
                write_status(cfg.run_dir, self.rank, "preempted", state.step, fence=self.fence,
                         total_steps=cfg.train.steps)
                return EXIT_REQUEUE
            if cfg.checkpoint.every_steps and state.step % cfg.checkpoint.every_steps == 0 and \
                    self.may_save("checkpoint"):
                self.save()
                last_saved = state.step
            if self.downstream is not None:
                if self.downstream.due(state.step) and self.may_save("checkpoint for downstream fine-tuning"):
                    self.downstream.launch(state.step, self.save())  # save() returns at once if already saved
                    last_saved = state.step
                self.downstream.poll()  # never blocks
            # after the step's checkpoint: an evaluation that fails (memory, data) does not cost the step's save
            if cfg.train.eval_every and self.comps.eval_batches and state.step % cfg.train.eval_every == 0:
                started = time.perf_counter()
                scores = self.evaluate()
                self.eval_seconds += time.perf_counter() - started
                self.metrics.log(state.step, scores, split="eval")
            if cfg.train.stop_at_step and state.step >= cfg.train.stop_at_step and state.step < cfg.train.steps:
                if last_saved != state.step and self.may_save("train.stop_at_step checkpoint", ends_launch=True):
                    self.save()
                self.metrics.message(f"stopped at step {state.step} (train.stop_at_step); continue with --resume auto")
                if self.downstream is not None:
                    self.downstream.suspend()
                write_status(cfg.run_dir, self.rank, "stopped", state.step, fence=self.fence,
                         total_steps=cfg.train.steps)
                return EXIT_OK
        if cfg.checkpoint.save_at_end and last_saved != state.step and \
                self.may_save("final checkpoint", ends_launch=True):
            self.save()
        if self.downstream is not None:
            self.downstream.finish()
        try:
            write_status(cfg.run_dir, self.rank, "completed", state.step, fence=self.fence,
                         total_steps=cfg.train.steps)
        except RunLockLostError as err:  # a takeover at the last step (no next step's all-reduce to stop every rank
            # together): rank 0 says it and fails; the other ranks (which write no status) go on to the shutdown's
            # barrier with it, instead of waiting there for a rank 0 gone with a traceback (second diff review)
            self.metrics.message(f"error: {err}")
            return EXIT_ERROR
        return EXIT_OK

    def _logged_grad_norm(self, result: StepResult) -> float | None:
        norm = self.engine.grad_norm()
        if norm is None and result.grad_norm is not None:
            norm = float(result.grad_norm)  # computed before this step's all-reduce and .tolist(): no stall
        return norm

    def _log(self, result: StepResult, lr: float, tokens: int, seconds: float, steps: int,
             squares: float = 0.0, waited: float = 0.0) -> None:
        seconds = max(seconds, 1e-9)
        now = time.time()
        record = {"loss": result.loss, "lr": lr, "tokens_per_s": tokens / seconds,
                  "samples_per_s": steps * self.cfg.train.global_batch_size / seconds,
                  "grad_norm": self._logged_grad_norm(result), "loss_scale": self.engine.loss_scale(),
                  "consumed_samples": self.state.consumed_samples, "skipped": self.state.skipped_steps,
                  # timings (trainer/metrics.py docstring): host clocks, no device sync
                  "step_s": seconds / steps, "data_wait_s": waited / steps, "window_s": now - self.last_record_time,
                  "save_s": self.save_seconds, "eval_s": self.eval_seconds}
        if result.rank_times:  # every rank's window, from the step's all-reduce: the slowest rank by each measure
            step_rank = max(range(len(result.rank_times)), key=lambda r: result.rank_times[r][0])
            wait_rank = max(range(len(result.rank_times)), key=lambda r: result.rank_times[r][1])
            record.update(max_step_s=result.rank_times[step_rank][0] / steps, max_step_rank=step_rank,
                          max_data_wait_s=result.rank_times[wait_rank][1] / steps, max_data_wait_rank=wait_rank)
        self.last_record_time, self.save_seconds, self.eval_seconds = now, 0.0, 0.0
        if self.comps.flops_per_token and self.peak_flops:
            # FLOPs of the rows as computed (trainer/flops.py): per real token + attention per attended segment^2
            done = self.comps.flops_per_token * tokens + self.comps.attention_flops * squares
            record["mfu"] = done / seconds / (self.peak_flops * self.world_size)
        record.update(result.metrics)
        self.metrics.log(self.state.step, record)
        # liveness: status.json follows the run at each record (one small atomic file on rank 0, through the lock's
        # fence; trainer/run_status.py says how a script tells a hung or dead run from it). A failed write is said,
        # not raised (as in save: rank 0 alone leaving the loop would hang the others). A lost lock is not raised here
        # either: the fence has marked it (RunLock.check sets lost), the next step's all-reduce carries it and every
        # rank stops together with the takeover's message (raised here, rank 0 left alone and rank 1 died in its next
        # collective with "Connection reset by peer": tests/test_run_lock.py)
        try:
            self.last_every_s = record["window_s"]
            write_status(self.cfg.run_dir, self.rank, "running", self.state.step, fence=self.fence,
                         total_steps=self.cfg.train.steps, every_s=record["window_s"])
        except RunLockLostError:
            pass
        except OSError as err:
            self.metrics.message(f"warning: could not update {self.cfg.run_dir}/status.json at step "
                                 f"{self.state.step}: {err}")

