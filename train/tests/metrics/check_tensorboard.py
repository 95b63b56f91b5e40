"""Opens an oxtrain run folder with TensorBoard's own reader and checks its scalars.

    python3 check_tensorboard.py LOGDIR EXPECTED.json

EXPECTED.json maps each tag to its [step, value] pairs as TensorBoard should show them (after
it drops the steps a resumed run logged again). Run by train/tests/metrics_tensorboard.rs
where the `tensorboard` package is importable; prints "ok" and exits 0 when all match.
"""
import json
import math
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main(logdir, expected_path):
    with open(expected_path) as f:
        expected = json.load(f)
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    if tags != set(expected):
        sys.exit(f"scalar tags {sorted(tags)}, expected {sorted(expected)}")
    for tag, pairs in expected.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        if [s for s, _ in got] != [s for s, _ in pairs]:
            sys.exit(f"{tag}: steps {[s for s, _ in got]}, expected {[s for s, _ in pairs]}")
        for (step, value), (_, want) in zip(got, pairs):
            # simple_value is a float32.
            if not math.isclose(value, want, rel_tol=1e-6, abs_tol=1e-12):
                sys.exit(f"{tag} at step {step}: {value}, expected {want}")
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
