"""Where a ghost-clipping DP-SGD step of the 1M-parameter MLP spends its time, part by part.

Set-ups of ``benchmarks/dpsgd_step.py``'s ``mlp_1m`` case (batch 64 by default), timed in
the same rounds, in an order rotating per round: the non-private step (forward, backward, SGD
step), and the private step in ghost mode with the trainable's optimizer
(``ray_dptune.training.noise``) and with ``make_private``'s own (Opacus's ``add_noise``).
The private step is cut at the seams of Opacus's own code: the forward with per-sample
losses, ``DPTensorFastGradientClipping.backward``'s two passes (the first one runs the
hooks that compute the per-example gradient norms; the second one backpropagates the loss
reweighted by the clipping coefficients, which yields the clipped sum) and
``DPOptimizer.pre_step``'s parts (``accumulate``, ``add_noise``, ``scale_grad``), then the
wrapped SGD's step. The parts are Opacus's calls in Opacus's order, so their sum is the step.
A fourth set-up times the Gaussian draws alone (``normal_`` of one value per parameter into a
kept buffer): the floor of any ``add_noise`` with torch's CPU generator.

Between rounds (``--churn``, default on) one step of the materialising ``ew`` mode at batch
256 frees and reallocates ~1 GB, as the full benchmark's interleaving does.

Usage::

    .venv/bin/python benchmarks/dpsgd_step_breakdown.py              # ~1 minute

Writes ``benchmarks/results/dpsgd_step_breakdown.md`` (``--output``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import dpsgd_step as bench
import torch

from ray_dptune.training.loop import _prepare_run, _Randomness

PARTS = (
    "zero_grad",
    "forward + per-sample losses",
    "backward 1 (+ per-example norms in hooks)",
    "zero_grad between the passes",
    "clipping coefficients",
    "backward 2 (clipped sum)",
    "accumulate",
    "add_noise (Gaussian draws + sum)",
    "scale_grad (÷ expected batch size)",
    "SGD step",
)
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "results" / "dpsgd_step_breakdown.md"


def private_step(run, times: dict[str, list[float]]):
    model, optimizer, criterion = run.model, run.optimizer, run.criterion

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        marks = [time.perf_counter()]
        optimizer.zero_grad(set_to_none=True)
        marks.append(time.perf_counter())
        loss = criterion(model(inputs), targets)
        marks.append(time.perf_counter())
        loss.loss_per_sample.mean(dim=0).backward(retain_graph=True)
        marks.append(time.perf_counter())
        optimizer.zero_grad()
        marks.append(time.perf_counter())
        coefficients = model.get_clipping_coef()
        marks.append(time.perf_counter())
        model.disable_hooks()
        torch.sum(coefficients * loss.loss_per_sample).backward()
        model.enable_hooks()
        marks.append(time.perf_counter())
        for part in (
            optimizer.accumulate,
            optimizer.add_noise,
            optimizer.scale_grad,
            optimizer.original_optimizer.step,
        ):
            part()
            marks.append(time.perf_counter())
        for name, start, end in zip(PARTS, marks, marks[1:]):
            times.setdefault(name, []).append(end - start)
        times.setdefault("step", []).append(marks[-1] - marks[0])

    return step


def plain_step(model, optimizer, times: dict[str, list[float]]):
    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        forward = time.perf_counter()
        loss.backward()
        backward = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        for name, value in (
            ("forward", forward - start),
            ("backward", backward - forward),
            ("SGD step", end - backward),
        ):
            times.setdefault(name, []).append(value)
        times.setdefault("step", []).append(end - start)

    return step


def draws_only(size: int, times: dict[str, list[float]]):
    buffer, generator = torch.empty(size), torch.Generator().manual_seed(0)

    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        start = time.perf_counter()
        buffer.normal_(0.0, bench.NOISE_MULTIPLIER * bench.HYPER.max_grad_norm, generator=generator)
        times.setdefault("step", []).append(time.perf_counter() - start)

    return step


def spec_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--reps", type=int, default=3, help="consecutive steps per set-up and round")
    parser.add_argument("--no-churn", dest="churn", action="store_false")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", message="Full backward hook is firing")
    warnings.filterwarnings("ignore", message="Secure RNG turned off")
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    n = 8 * args.batch_size
    dataset = torch.utils.data.TensorDataset(*bench.KINDS["mlp_1m"][1](n, generator))
    batches = []
    for _ in range(8):
        mask = torch.rand(n, generator=generator) < args.batch_size / n
        batches.append((dataset.tensors[0][mask], dataset.tensors[1][mask]))
    spec = bench.TrainSpec(
        model_fn=bench.mlp_1m,
        data_fn=lambda config: (dataset, dataset),
        loss_fn=torch.nn.functional.cross_entropy,
        privacy=bench.PrivacyParams(noise_multiplier=bench.NOISE_MULTIPLIER, batch_size=args.batch_size, epochs=1),
        grad_sample_mode="ghost",
        seed=0,
    )
    cpu = torch.device("cpu")

    def run(**clipping):
        return _prepare_run({}, spec, spec.privacy, bench.HYPER, dataset, None, _Randomness(0, cpu), cpu, **clipping)

    times: dict[str, dict[str, list[float]]] = {"non-private": {}, "ours": {}, "opacus": {}, "draws": {}}
    torch.manual_seed(0)
    plain = bench.mlp_1m()
    steps = {
        "non-private": plain_step(plain, torch.optim.SGD(plain.parameters(), lr=bench.HYPER.lr), times["non-private"]),
        "ours": private_step(run(), times["ours"]),
        "opacus": private_step(run(clipping=bench.OpacusNoise()), times["opacus"]),
        "draws": draws_only(spec_parameters(plain), times["draws"]),
    }
    churn = bench.build_case("mlp_1m", 256, ("ew",)) if args.churn else None
    names = list(steps)
    for round_ in range(args.rounds + 2):  # 2 warm-up rounds
        if round_ == 2:
            for record in times.values():
                record.clear()
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            for rep in range(args.reps):
                steps[name](*batches[(round_ * args.reps + rep) % len(batches)])
        if churn is not None:
            churn.setups[1].step(churn.batches[round_ % len(churn.batches)])
    median = {name: {part: 1e3 * statistics.median(v) for part, v in record.items()} for name, record in times.items()}
    base = median["non-private"]["step"]
    env = bench.environment(1)
    lines = [
        f"# Ghost-clipping DP-SGD step of mlp_1m at batch {args.batch_size}, part by part",
        "",
        f"- Command: `{env['command']}`",
        f"- Date (UTC): {env['date']}",
        f"- Versions: {env['versions']}",
        f"- Machine: {env['machine']}; torch threads: 1",
        (
            f"- {args.rounds} rounds × {args.reps} steps per set-up, order rotating; medians of single steps;"
            f" {'one ew step at batch 256 (~1 GB) between rounds' if args.churn else 'no churn'}."
        ),
        "",
        "| part | ours ms | Opacus's optimizer ms |",
        "|---|--:|--:|",
    ]
    lines += [f"| {part} | {median['ours'][part]:.2f} | {median['opacus'][part]:.2f} |" for part in PARTS]
    lines += [
        (
            f"| **step** | **{median['ours']['step']:.2f}** ({median['ours']['step'] / base:.2f}×) "
            f"| **{median['opacus']['step']:.2f}** ({median['opacus']['step'] / base:.2f}×) |"
        ),
        "",
        (
            f"Non-private step: {base:.2f} ms (forward {median['non-private']['forward']:.2f}, backward "
            f"{median['non-private']['backward']:.2f}, SGD step {median['non-private']['SGD step']:.2f})."
        ),
        (
            f"The Gaussian draws alone (`normal_` of {spec_parameters(plain):,} floats into a kept buffer, same rounds): "
            f"{median['draws']['step']:.2f} ms ({median['draws']['step'] / base:.2f}× the non-private step)."
        ),
        "",
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
