"""Fixtures for the LR schedules with PyTorch as the reference: the learning rates of two
parameter groups (base 0.1 and 0.01) after construction and after each of 30 steps, for every
schedule and the compositions. Needs torch.

    python3 nn/src/lr_scheduler/fixtures.py
"""

import os
import sys
import warnings

import torch
from torch.optim import lr_scheduler as S

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../scripts/fixtures"))
from fixture_io import tensor, write  # noqa: E402

warnings.filterwarnings("ignore")
STEPS = 30
cases = {}


def record(name, make):
    p0, p1 = torch.zeros(1, requires_grad=True), torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([{"params": [p0]}, {"params": [p1], "lr": 0.01}], lr=0.1)
    sched = make(opt)
    lrs = [sched.get_last_lr()]
    for _ in range(STEPS):
        opt.step()
        sched.step()
        lrs.append(sched.get_last_lr())
        assert lrs[-1] == [g["lr"] for g in opt.param_groups]
    cases[name] = {"lrs": tensor(torch.tensor(lrs, dtype=torch.float64))}


record("lambda", lambda o: S.LambdaLR(o, lambda e: 0.95 ** e))
record("step", lambda o: S.StepLR(o, step_size=5, gamma=0.5))
record("multistep", lambda o: S.MultiStepLR(o, milestones=[3, 7, 7, 12], gamma=0.3))
record("constant", lambda o: S.ConstantLR(o, factor=1 / 3, total_iters=5))
record("linear", lambda o: S.LinearLR(o, start_factor=0.1, end_factor=1.0, total_iters=8))
record("linear_decay", lambda o: S.LinearLR(o, start_factor=1.0, end_factor=0.05, total_iters=25))
record("exponential", lambda o: S.ExponentialLR(o, gamma=0.9))
record("polynomial", lambda o: S.PolynomialLR(o, total_iters=20, power=2.0))
# Past T_max the chainable cosine climbs back up; both branches of its recurrence show.
record("cosine", lambda o: S.CosineAnnealingLR(o, T_max=10, eta_min=1e-4))
record("warmup_cosine", lambda o: S.SequentialLR(
    o, [S.LinearLR(o, start_factor=0.1, total_iters=5), S.CosineAnnealingLR(o, T_max=25, eta_min=1e-5)], [5]))
record("three_stages", lambda o: S.SequentialLR(
    o, [S.ConstantLR(o, factor=0.5, total_iters=10), S.ExponentialLR(o, gamma=0.8), S.StepLR(o, 4, 0.5)], [4, 12]))
record("chained", lambda o: S.ChainedScheduler([S.ConstantLR(o, factor=0.5, total_iters=4), S.ExponentialLR(o, gamma=0.9)]))

write(__file__, cases)
